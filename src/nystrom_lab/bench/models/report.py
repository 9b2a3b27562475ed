"""Markdown and PNG of ``nystrom bench models`` (see :mod:`nystrom_lab.bench.models.driver`).

Legend: b batch, n tokens.

Torch-free on purpose: ``nystrom docs render`` rebuilds every report, the comparison tables of
docs/benchmarks.md and (``--plots``) the figure from the committed ``bench_models.json`` files with these
same writers.
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.bench.models.cases import ALL_MODELS, MODES

#: column headings of the comparison tables (docs/benchmarks.md), in :data:`MODELS` order
LABELS = {
    "ours-nystrom": "ours-nystrom", "ours-nystrom-recompute": "ours recompute", "ours-softmax": "ours-softmax",
    "hf-nystromformer": "HF Nystromformer", "hf-longformer": "HF Longformer", "hf-bigbird": "HF BigBird",
    "hf-bert": "HF BERT", "ours-nystrom-graphed": "ours CUDA graph", "ours-nystrom-compiled": "ours compiled",
    "ours-nystrom-pytorch": "ours PyTorch path", "hf-bert-nystrom": "HF BERT nystrom",
}  # fmt: skip


def render(report: dict) -> str:
    """Markdown: one table per mode, rows (n, b, model) with time, tokens/s, peak and our ratios."""
    out = [f"Whole models, {report['size']} size, {report['dtype']} on {report.get('device', 'cpu')}, random weights; median of {report['rounds']} "
           f"interleaved rounds × {report['repeats']} calls, each case in a fresh process. "
           f"Machine: {report['machine']['cpu']}, {report['machine']['threads']} threads, torch "
           f"{report['machine']['torch']}, transformers {report['machine']['transformers']}.\n"]  # fmt: skip
    for mode in MODES:
        rows = [r for r in report["rows"] if r["mode"] == mode]
        if not rows:
            continue
        out += [f"\n**{mode}**\n", "| n | b | model | s | tokens/s | peak MB | vs fastest HF | vs ours exact | ÷ floor |",
                "|---:|---:|---|---:|---:|---:|---|---|---:|"]  # fmt: skip
        for r in sorted(rows, key=lambda r: (r["n"], r["batch"], ALL_MODELS.index(r["model"]))):
            if "error" in r or "skipped" in r:
                why = r.get("error") or f"skipped: {r['skipped']}"
                out.append(f"| {r['n']} | {r['batch']} | {r['model']} | — | — | — | {why} | | |")
                continue
            vs = r.get("vs_fastest_other")
            ex = r.get("vs_ours_exact")
            out.append(
                f"| {r['n']} | {r['batch']} | {r['model']} | {r['median_s']:.2f} (±{100 * (r['spread'] - 1):.0f} %) | "
                f"{r['tokens_per_s']:,.0f} | {r['peak_mb']:.0f} | "
                + (f"{vs['speedup']:.2f}× faster, {vs['memory']:.2f}× memory ({vs['model']})" if vs else "")
                + " | " + (f"{ex['speedup']:.2f}×, {ex['memory']:.2f}× memory" if ex else "")
                + " | " + (f"{r['x_floor']:.2f}" if "x_floor" in r else "") + " |"
            )  # fmt: skip
    return "\n".join(out) + "\n"


def cases(report: dict, mode: str, n: int, batch: int = 1) -> dict[str, dict]:
    """One (mode, n, batch) group of a report: model -> its row."""
    return {r["model"]: r for r in report["rows"] if (r["mode"], r["n"], r["batch"]) == (mode, n, batch)}


def compare_table(
    corner: list[str],
    lines: list[tuple[list[str], dict[str, dict]]],
    *,
    models: tuple[str, ...],
    ms: bool = False,
    labels: dict[str, str] | None = None,
) -> str:
    """A table with one column per model, each cell ``time (peak MB)``: seconds to 2 decimals, or with
    ``ms`` milliseconds to 1. ``corner``: the headings before the model columns; ``lines``: per row its
    leading cells and its :func:`cases`. A failed case reads ``error¹`` (the text says why). Seconds mark
    ours-nystrom in bold where it is the fastest model apart from its own recompute twin (which runs the
    same inference code). ``labels`` overrides column headings of :data:`LABELS`."""
    names = {**LABELS, **(labels or {})}
    head = [*corner, *(names[m] for m in models)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(corner) + "---:|" * len(models)]
    for lead, group in lines:
        cells = []
        for m in models:
            r = group.get(m)
            if r is None or "median_s" not in r:
                cells.append("—" if r is None or "skipped" in r else "error¹")
                continue
            t = f"{1e3 * r['median_s']:.1f}" if ms else f"{r['median_s']:.2f}"
            rivals = [
                o["median_s"]
                for k, o in group.items()
                if k not in (m, "ours-nystrom-recompute") and "median_s" in o
            ]
            bold = not ms and m == "ours-nystrom" and all(r["median_s"] < s for s in rivals)
            cell = f"{t} ({r['peak_mb']:.0f})"
            cells.append(f"**{cell}**" if bold else cell)
        out.append("| " + " | ".join([*lead, *cells]) + " |")
    return "\n".join(out)


def plot(report: dict, png: Path) -> Path:
    """Seconds and peak MB against n (log-log), inference and training step, one line per model, the
    smallest batch; a failed case ends its model's line (its error is in the table)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    batch = min(r["batch"] for r in rows)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for col, mode in enumerate(MODES):
        for model in ALL_MODELS:
            pts = sorted((r["n"], r) for r in rows if (r["mode"], r["model"], r["batch"]) == (mode, model, batch)
                         and "median_s" in r)  # fmt: skip
            if not pts:
                continue
            style = (
                {"lw": 2.5, "marker": "o"}
                if model.startswith("ours")
                else {"lw": 1.2, "marker": "s", "ls": "--"}
            )
            ns = [n for n, _ in pts]
            axes[0, col].plot(ns, [r["median_s"] for _, r in pts], label=model, **style)
            axes[1, col].plot(ns, [r["peak_mb"] for _, r in pts], label=model, **style)
        axes[0, col].set_title(f"{mode}, batch {batch}")
        axes[0, col].set_ylabel("seconds (median)")
        axes[1, col].set_ylabel("peak MB above the start")
        axes[1, col].set_xlabel("tokens n")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(report.get("title") or f"Whole models, {report['size']} size, {report['dtype']} on "
                 f"{report.get('device', 'cpu')} ({report['machine']['cpu']}, {report['machine']['threads']} threads)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
