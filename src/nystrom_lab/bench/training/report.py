"""Markdown report of ``nystrom bench training`` (see :mod:`nystrom_lab.bench.training.driver`).

Legend: e model width, h heads, d head dim, m landmarks, n tokens.

Torch-free on purpose: ``nystrom docs render`` rebuilds the report from the committed
``bench_training*.json`` with this same writer.
"""

from __future__ import annotations

from pathlib import Path

ANCHORS = ("hf", "lucidrains")
#: the two regimes' layer sizes (the training benchmark's cases; kept here so the report needs no torch)
REGIMES = {
    "paper": dict(h=8, d=64, m=64, conv=None, dropout=0.0, lengths=(4096, 16384, 65536)),
    "transmil": dict(h=8, d=64, m=256, conv=33, dropout=0.1, lengths=(6000, 20000)),
}
QUICK = {
    "paper": dict(h=2, d=16, m=8, conv=None, dropout=0.0, lengths=(64,)),
    "transmil": dict(h=2, d=16, m=16, conv=5, dropout=0.1, lengths=(96,)),
}


def report(data: dict, *, suffix: str = "") -> str:
    """The report of one run's ``bench_training{suffix}.json``. Runs written before the file recorded its
    regimes ran the full-size ones (a ``--quick`` run says so in its note)."""
    quick = "--quick" in data["info"].get("note", "")
    regimes = data.get("regimes") or (QUICK if quick else REGIMES)
    return render(data["rows"], data["floors"], data["listops"], data["info"], regimes=regimes, suffix=suffix)


def _f(x: float | None, fmt: str = "") -> str:
    """A cell: — for missing; ms with 3 significant digits unless ``fmt`` is given."""
    if x is None:
        return "—"
    return format(x, fmt or (".0f" if abs(x) >= 100 else ".3g"))


def render(
    rows: list[dict],
    floors: list[dict],
    steps: dict | None,
    info: dict,
    *,
    regimes: dict[str, dict],
    suffix: str = "",
) -> str:
    """Markdown tables: per regime one row per (n, implementation), the floor, and the ListOps step."""
    lines = [
        f"Command: `{info['command']}` ({info['seconds']} s{info.get('note', '')}).",
        f"Machine: {info['cpu']}, {info['threads']} threads; torch {info['torch']}, transformers "
        f"{info['transformers']}, nystrom-attention {info['nystrom_attention']}, Python {info['python']}; "
        f"allocator: {info.get('allocator', 'not recorded')}.",
        "One attention layer (b = 1, fp32, training mode) forward and backward of a fixed random output "
        "gradient; every figure the median of interleaved rounds in one process; spread = (max − min) / "
        "median; speed-up = median over rounds of their fwd+bwd ÷ ours (> 1: we are faster); memory = "
        "our peak ÷ theirs (first fwd+bwd in a fresh process; < 1: we use less).",
        "",
    ]
    for reg in dict.fromkeys(r["regime"] for r in rows):
        p = regimes[reg]
        conv = f"conv {p['conv']}" if p["conv"] else "no conv"
        lines += [
            f"### {reg}: e = {p['h'] * p['d']}, h = {p['h']}, m = {p['m']}, {conv}, dropout {p['dropout']}",
            "",
            "| n | impl | fwd ms | bwd ms | fwd+bwd ms | spread | bwd ÷ fwd | peak MB | speed-up | memory |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in (r for r in rows if r["regime"] == reg):
            ours = next(o for o in rows if o["regime"] == reg and o["n"] == r["n"] and o["impl"] == "nystrom")
            if "error" in r:
                lines.append(f"| {r['n']} | {r['impl']} | {r['error']} |" + " |" * 7)
                continue
            mem = r.get("peak_mb")
            theirs = not r["impl"].startswith("nystrom")  # ratios only against the other implementations
            ratio = ours.get("peak_mb") / mem if theirs and mem and ours.get("peak_mb") else None
            speed = r.get("speedup") if theirs else None
            lines.append(
                f"| {r['n']} | {r['impl']} | {_f(r.get('fwd_ms'))} | {_f(r.get('bwd_ms'))} | {_f(r['ms'])} | "
                f"{r['spread']:.0%} | {_f(r.get('bwd_ms', 0) / r['fwd_ms'] if r.get('fwd_ms') else None, '.2f')} | "
                f"{_f(mem)} | {_f(speed, '.2f')}{'×' if speed else ''} | {_f(ratio, '.2f')}{'×' if ratio else ''} |"
            )
        lines.append("")
        lines += ["| n | GEMM GFLOP/s | floor ms | ours ms | ours ÷ floor |", "|---|---:|---:|---:|---:|"]
        for f in (f for f in floors if f["regime"] == reg):
            ours = next(o for o in rows if o["regime"] == reg and o["n"] == f["n"] and o["impl"] == "nystrom")
            ms = ours.get("ms")
            lines.append(
                f"| {f['n']} | {f['gflops']:.0f} | {_f(f['floor_ms'])} | {_f(ms)} | "
                f"{_f(ms / f['floor_ms'] if ms else None, '.2f')} |"
            )
        lines.append("")
    lines.append(
        "Floor = our layer's forward + backward FLOPs (projections 24·n·e², core 28·n·m·e, conv 6·K·n·e, "
        "pseudo-inverse 144·m³·h) over the GEMM rate timed once per round beside the cases."
    )
    lines += ["", *_anchor_table(rows)]
    if steps:
        res = steps["results"]
        lines += [
            "",
            f"### LRA ListOps training step (official model, batch {steps['batch']}, length {steps['length']}, "
            "AdamW; the same model with every attention layer swapped for lucidrains')",
            "",
            "| attention | step ms | spread | speed-up of ours |",
            "|---|---:|---:|---:|",
            f"| ours | {res['nystrom']['ms']:.0f} | {res['nystrom']['spread']:.0%} | |",
            f"| lucidrains | {res['lucidrains']['ms']:.0f} | {res['lucidrains']['spread']:.0%} | "
            f"{res['lucidrains']['speedup']:.2f}× |",
        ]
    lines += [
        "",
        f"![forward + backward time and memory vs n](training{suffix}.png) — data: `bench_training{suffix}.json`.",
    ]
    return "\n".join(lines)


def plot(data: dict, png: Path, *, malloc: str) -> None:
    """Time and memory against n of every implementation in each regime (a run's ``training*.png``)."""
    from nystrom_lab.bench.plots import plot_table1

    rows = [
        {**r, "label": f"{r['impl']} ({r['regime']})"} for r in data["rows"] if "ms" in r and "peak_mb" in r
    ]
    title = f"one attention layer, forward + backward ({data['info']['cpu']}, malloc {malloc})"
    plot_table1(rows, png, title=title)


def _anchor_table(rows: list[dict]) -> list[str]:
    """Ours and ours with ``recompute=True`` against the faster of HF and lucidrains at every case."""
    lines = [
        "### Against the faster of HF and lucidrains (the reference of the training targets)",
        "",
        "speed-up = anchor's fwd+bwd ÷ ours (> 1: we are faster); memory = our peak ÷ the anchor's (< 1: we "
        "use less). `recompute` = `NystromAttention(..., recompute=True)` (q/k/v rebuilt head by head in the "
        "backward).",
        "",
        "| regime | n | anchor | speed-up | memory | recompute: speed-up | recompute: memory |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for reg, n in dict.fromkeys((r["regime"], r["n"]) for r in rows):
        case = {r["impl"]: r for r in rows if r["regime"] == reg and r["n"] == n and "ms" in r}
        anchors = [case[a] for a in ANCHORS if a in case]
        if "nystrom" not in case or not anchors:
            continue
        anchor = min(anchors, key=lambda r: r["ms"])
        cells = []
        for impl in ("nystrom", "nystrom-recompute"):
            ours = case.get(impl)
            speed = anchor["ms"] / ours["ms"] if ours else None
            mem = (
                ours["peak_mb"] / anchor["peak_mb"]
                if ours and ours.get("peak_mb") and anchor.get("peak_mb")
                else None
            )
            cells += [f"{_f(speed, '.2f')}{'×' if speed else ''}", f"{_f(mem, '.2f')}{'×' if mem else ''}"]
        lines.append(f"| {reg} | {n} | {anchor['impl']} | " + " | ".join(cells) + " |")
    return lines
