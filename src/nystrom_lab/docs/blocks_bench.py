"""Blocks of docs/benchmarks.md made by the CPU attention benchmarks (core, training, Table 1, approx).

Each render reads only the committed files its :class:`~nystrom_lab.docs.block.Block` names and formats
them with the benchmark's own writer, so a bench run and ``nystrom docs render`` write the same text.
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.bench.approx import report as approx_report
from nystrom_lab.bench.core import report as core_report
from nystrom_lab.bench.floors import attention_core_floor_ms
from nystrom_lab.bench.table1 import report as table1_report
from nystrom_lab.bench.training import report as training_report
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_csv, read_json

DOC = "docs/benchmarks.md"
ATTENTION = ("docs/bench_attention.csv", "docs/bench_attention.json")


def attention(rows_csv: Path, meta_json: Path) -> str:
    """The core benchmark's tables (``nystrom bench core``)."""
    meta = read_json(meta_json)
    return core_report.render(read_csv(rows_csv), meta["info"], **meta["settings"])


def attention_targets(rows_csv: Path, meta_json: Path) -> str:
    """The attention core's speed and memory targets, measured on the same run as the ``bench-attention`` tables."""
    rows, settings = read_csv(rows_csv), read_json(meta_json)["settings"]
    get = {(r["impl"], r["mode"], r["n"]): r for r in rows}

    def ms(impl: str, mode: str, n: int) -> float:
        return get[(impl, mode, n)]["ms"]

    def vs(mode: str, n: int, key: str = "ms") -> list[float]:
        """Our speed-up (``key`` "ms") or memory ratio ("peak_mb") against HF and lucidrains."""
        ours = get[("nystrom", mode, n)][key]
        return [
            get[(i, mode, n)][key] / ours if key == "ms" else ours / get[(i, mode, n)][key]
            for i in ("hf", "lucidrains")
        ]

    def pair(values: list[float]) -> str:
        return " / ".join(f"{v:.2f}×" for v in values)

    big, small = 65536, 16384
    ours = get[("nystrom", "core", big)]
    floor = attention_core_floor_ms(
        big, landmarks=settings["landmarks"], dim_head=settings["dim_head"], heads=settings["heads"],
        gflops=ours["gemm_gflops"],
    )  # fmt: skip
    anchor = min(ms("hf", "core", big), ms("lucidrains", "core", big))
    growth = ms("nystrom", "core", big) / ms("nystrom", "core", 8192)
    lines = [
        ("core forward vs the faster of HF / lucidrains", "≥ 1.5×", f"{anchor:.1f} / {ours['ms']:.1f} = **{anchor / ours['ms']:.2f}×**", anchor / ours["ms"] >= 1.5),
        ("core forward vs the FLOP floor", "≤ 2×", f"{ours['ms']:.1f} / {floor:.1f} = **{ours['ms'] / floor:.2f}×**", ours["ms"] / floor <= 2),
        *((f"module forward{t} vs HF / lucidrains, n = {n}", "≥ 1.1×", pair(vs(mode, n)), min(vs(mode, n)) >= 1.1)
          for mode, t in (("fwd", ""), ("fwdbwd", " + backward")) for n in (big, small)),
        ("module forward peak memory vs HF / lucidrains", "≤ 0.5×", pair(vs("fwd", big, "peak_mb")), max(vs("fwd", big, "peak_mb")) <= 0.5),
        (f"core time({big}) / time(8192)", "≤ 8.5", f"{ms('nystrom', 'core', big):.1f} / {ms('nystrom', 'core', 8192):.1f} = **{growth:.2f}**", growth <= 8.5),
    ]  # fmt: skip
    out = ["| criterion | target | measured | |", "|---|---|---|---|"]
    out += [f"| {c} | {t} | {m} | {'met' if ok else 'not met'} |" for c, t, m, ok in lines]
    return "\n".join(out)


def training(path: Path) -> str:
    """The training benchmark under glibc's default allocator."""
    return training_report.report(read_json(path))


def training_cached(path: Path) -> str:
    """The training benchmark with freed memory kept (``--malloc cached``)."""
    return training_report.report(read_json(path), suffix="_cached")


def recompute_cost(path: Path) -> str:
    """``recompute=True`` at 65536 tokens (paper regime): its peak against HF's and lucidrains', in U (one
    n × 512 fp32 tensor), and its time against the default layer's and HF's."""
    rows = {(r["regime"], r["n"], r["impl"]): r for r in read_json(path)["rows"]}
    n = 65536
    lean, ours, hf, luc = (
        rows[("paper", n, i)] for i in ("nystrom-recompute", "nystrom", "hf", "lucidrains")
    )
    unit_mb = n * 512 * 4 / 2**20
    return (
        f"{lean['peak_mb']:.0f} MB ≈ {lean['peak_mb'] / unit_mb:.0f} U at {n} ({lean['peak_mb'] / hf['peak_mb']:.2f}× "
        f"HF's, {lean['peak_mb'] / luc['peak_mb']:.2f}× lucidrains'), at +6·n·e² FLOPs plus the core's forward again: "
        f"+{100 * (lean['ms'] / ours['ms'] - 1):.0f} % time at {n}, {hf['ms'] / lean['ms']:.2f}× HF's speed there"
    )


def table1(rows_csv: Path, run_json: Path) -> str:
    """The paper's Table 1 on this CPU (``nystrom bench``)."""
    return table1_report.report(read_csv(rows_csv), read_json(run_json))


def approx(rows_csv: Path, run_json: Path) -> str:
    """The approximation study (``nystrom approx``)."""
    return approx_report.report(read_csv(rows_csv), read_json(run_json))


def compile_table(path: Path) -> str:
    """Eager vs ``torch.compile`` (``python -m nystrom_lab.bench.compile``'s table)."""
    from nystrom_lab.bench.compile.report import render

    return render(read_json(path)["rows"])


def mkl_onednn(path: Path) -> str:
    """GFLOP/s of the projection GEMMs through MKL and oneDNN (projections on AMD)."""
    data = read_json(path)
    out = [
        "| n | shape (k→o) | fwd MKL / oneDNN | dX MKL / oneDNN | dW MKL / oneDNN |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        cells = [f"{r[p]['mkl']:.0f} / {r[p]['onednn']:.0f}" for p in ("fwd", "dx", "dw")]
        shape = f"{r['k']}→{r['o']}" + (f" ({r['note']})" if r.get("note") else "")
        out.append(f"| {r['n']} | {shape} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def lucidrains_parity(path: Path) -> str:
    """Our compat layer against lucidrains' on TransMIL's layer (``python -m nystrom_lab.bench.lucidrains``)."""
    from nystrom_lab.bench.lucidrains.report import render

    return render(read_json(path)["rows"])


BLOCKS = [
    Block(DOC, "bench-attention", ATTENTION, attention),
    Block(DOC, "bench-attention-targets", ATTENTION, attention_targets),
    Block(DOC, "bench-training", ("docs/bench_training.json",), training),
    Block(DOC, "recompute-65536", ("docs/bench_training.json",), recompute_cost, inline=True),
    Block(DOC, "bench-training-cached", ("docs/bench_training_cached.json",), training_cached),
    Block(DOC, "table1", ("docs/table1_fwd.csv", "docs/table1_fwd.json"), table1),
    Block(DOC, "approx", ("docs/approx.csv", "docs/approx.json"), approx),
    Block(DOC, "bench-compile", ("docs/bench_compile.json",), compile_table),
    Block(DOC, "mkl-onednn", ("docs/mkl_onednn.json",), mkl_onednn),
    Block("docs/lucidrains.md", "lucidrains-parity", ("docs/lucidrains_parity.json",), lucidrains_parity),
]
