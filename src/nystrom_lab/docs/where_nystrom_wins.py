"""docs/where_nystrom_wins.png, the README's opening figure: time against n for the attention module and for
whole models, on the CPU and on the GPU, ours Nyström against exact attention and transformers'
Nystromformer, with the lengths where ours is the fastest of the lines shaded (drawn by
``nystrom docs render --plots`` from the committed data only).

Legend: n tokens; a *series* is one implementation's ms by n; the *crossing* is where ours becomes the
fastest of the panel's lines for good, log-log interpolated between the two measured lengths around it.
"""

from __future__ import annotations

import math
from pathlib import Path

from nystrom_lab.bench.models.cases import SIZES
from nystrom_lab.docs.data import read_csv, read_json
from nystrom_lab.docs.gpu_run import ENV, MODELS_RUN, PROVENANCE, TABLES, crossing_of, run_info

PNG = "docs/where_nystrom_wins.png"
OURS = "ours Nyström-64"
EXACT = "exact softmax, SDPA (module: the fused kernel; model: ours with softmax attention)"
# label -> line style; the same implementation keeps its colour in every panel
STYLES = {
    OURS: {"color": "tab:red", "lw": 2.6, "marker": "o", "zorder": 5},
    EXACT: {"color": "tab:blue", "lw": 1.6, "marker": "s"},
    "exact: transformers BERT (SDPA)": {"color": "tab:purple", "lw": 1.4, "marker": "D", "ls": "-."},
    "transformers Nystromformer": {"color": "tab:green", "lw": 1.4, "marker": "^", "ls": "--"},
}
MODEL_LABELS = {"ours-nystrom": OURS, "ours-softmax": EXACT,
                "hf-bert": "exact: transformers BERT (SDPA)", "hf-nystromformer": "transformers Nystromformer"}  # fmt: skip
# docs/benchmarks.md, "On a GPU": what the attention runs' CSV and JSON do not record
GPU_ATTENTION = "m = 64, conv off"
SIZE_NAMES = {"minilm": "MiniLM"}


def _k(n: float) -> str:
    """A measured length as the figure writes it, K = 1024: ``512``, ``4K``, ``128K``."""
    return f"{n:.0f}" if n < 1024 else f"{n / 1024:g}K"


def _about(n: float) -> str:
    """An interpolated length, to two digits: ``900``, ``20K``."""
    return f"{float(f'{n:.2g}'):.0f}" if n < 1024 else f"{float(f'{n / 1024:.2g}'):g}K"


def _log_labels(y: float, _pos: object) -> str:
    """Log-axis tick labels as plain numbers, on 1, 2 and 5 times a power of ten only."""
    mantissa = round(y / 10 ** math.floor(math.log10(y) + 1e-9), 6)
    return f"{y:g}" if mantissa in (1, 2, 5) else ""


def _attention_cpu(root: Path) -> dict:
    """The CPU's ``nystrom bench core`` run: the whole module's forward under no_grad."""
    run = read_json(root / "docs/bench_attention.json")
    info, s = run["info"], run["settings"]
    rows = [r for r in read_csv(root / "docs/bench_attention.csv") if r["mode"] == "fwd" and "ms" in r]
    names = {"nystrom": OURS, "sdpa": EXACT, "hf": "transformers Nystromformer"}
    return {
        "title": f"Attention module, CPU ({info['cpu']}, {info['threads']} threads)\n"
        f"{s['dtype']} forward (no_grad), batch 1, h = {s['heads']}, d = {s['dim_head']}, m = {s['landmarks']}, conv off",
        "series": {
            label: {r["n"]: r["ms"] for r in rows if r["impl"] == impl} for impl, label in names.items()
        },
    }


def _gpu(root: Path) -> str:
    """The GPU run, as the panels' titles name it: ``NVIDIA H100 80GB HBM3, 2026-11-28``."""
    info = run_info(root / ENV, root / PROVENANCE)
    return f"{info['gpu']}, {info['date']}"


def _attention_gpu(root: Path) -> dict:
    """The GPU run's Table 1 modules, bf16 forward: ours, SDPA and transformers' Nyström where it ran."""
    rows = [r for r in read_csv(root / TABLES["bfloat16_fwd"]) if "ms" in r]
    s = read_json((root / TABLES["bfloat16_fwd"]).with_suffix(".json"))
    names = {"nystrom-64": OURS, "sdpa": EXACT, "hf-nystrom-64": "transformers Nystromformer"}
    series = {label: {r["n"]: r["ms"] for r in rows if r["method"] == m} for m, label in names.items()}
    return {
        "title": f"Attention module, GPU ({_gpu(root)})\nbf16 forward, batch {s['batch']}, h = {s['heads']}, "
        f"d = {s['dim_head']}, {GPU_ATTENTION}",
        "series": series,
        "missing": ""
        if series["transformers Nystromformer"]
        else "transformers Nystromformer: not run on the GPU",
    }


def _models(run: dict, where: str, dtype: str) -> dict:
    """A ``nystrom bench models`` run's inference rows at its smallest batch, in ms."""
    rows = [r for r in run["rows"] if r["mode"] == "inference" and "median_s" in r]
    batch = min(r["batch"] for r in rows)
    series = {label: {r["n"]: 1e3 * r["median_s"] for r in rows if (r["model"], r["batch"]) == (m, batch)}
              for m, label in MODEL_LABELS.items()}  # fmt: skip
    size = SIZES[run["size"]]
    return {
        "title": f"Whole model ({SIZE_NAMES.get(run['size'], run['size'])} size: {size['layers']} layers, "
        f"e = {size['hidden']}), {where}\n{dtype} inference, batch {batch}",
        "series": series,
    }


def _crossing(series: dict[str, dict[int, float]]) -> tuple[float | None, list[tuple[int, float]]]:
    """Where ours becomes the fastest line for good (None: never, at the lengths run) and, per length of
    ours, ours' time ÷ the fastest other line's (>1: ours slower)."""
    ours = series[OURS]
    ratios = []
    for n in sorted(ours):
        others = [s[n] for label, s in series.items() if label != OURS and n in s]
        if others:
            ratios.append((n, ours[n] / min(others)))
    return crossing_of(ratios), ratios


def _panel(ax, panel: dict) -> None:
    """One panel: the lines, the shaded win and loss ranges, and the sentence saying where ours wins."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    series = {label: s for label, s in panel["series"].items() if s}
    for label, s in series.items():
        ns = sorted(s)
        ax.plot(ns, [s[n] for n in ns], label=label, ms=4, **STYLES[label])
    ns = sorted({n for s in series.values() for n in s})
    lo, hi = ns[0] / 2**0.4, ns[-1] * 2**0.4
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(FixedLocator(ns))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _k(x)))
    ax.yaxis.set_major_formatter(FuncFormatter(_log_labels))
    ax.yaxis.set_minor_formatter(FuncFormatter(_log_labels))
    ymin = min(v for s in series.values() for v in s.values())
    ymax = max(v for s in series.values() for v in s.values()) * 1.3
    ax.set_ylim(ymin / (ymax / ymin) ** 0.25, ymax)  # the lowest point above the bottom fifth (the note)
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", axis="y", alpha=0.12)
    cross, ratios = _crossing(series)
    box = {"boxstyle": "round,pad=0.3", "alpha": 0.9}
    if cross is None:
        ax.axvspan(lo, hi, color="tab:red", alpha=0.07, lw=0)
        slower = ", ".join(f"{r:.1f}× at {_k(n)}" for n, r in ratios)
        text = f"Nyström loses at every length run\n(slower than the fastest line: {slower})"
        ax.text(0.5, 0.04, text, transform=ax.transAxes, ha="center", va="bottom", fontsize=8.5,
                color="darkred", bbox={**box, "fc": "mistyrose", "ec": "darkred"})  # fmt: skip
    else:
        ax.axvspan(max(cross, lo), hi, color="tab:green", alpha=0.12, lw=0)
        if cross > lo:
            ax.axvspan(lo, cross, color="tab:red", alpha=0.07, lw=0)
        n_end, r_end = ratios[-1]
        text = f"Nyström wins from n ≈ {_about(cross)}\n({1 / r_end:.1f}× faster than the fastest other at {_k(n_end)})"
        ax.text(0.98, 0.04, text, transform=ax.transAxes, ha="right", va="bottom", fontsize=8.5,
                color="darkgreen", bbox={**box, "fc": "honeydew", "ec": "darkgreen"})  # fmt: skip
    if panel.get("missing"):
        ax.text(0.02, 0.96, panel["missing"], transform=ax.transAxes, fontsize=7.5, color="dimgray", va="top")
    ax.set_title(panel["title"], fontsize=9)


def panels(root: Path) -> list[dict]:
    """The figure's four panels (title, series: label -> {n: ms}), from the committed data: the attention
    module and whole models, on the CPU and in the GPU run of docs/gpu/."""
    cpu = read_json(root / "docs/bench_inference/bench_models.json")
    gpu = read_json(root / MODELS_RUN)
    cpu_where = f"CPU ({cpu['machine']['cpu']}, {cpu['machine']['threads']} threads)"
    return [
        _attention_cpu(root),
        _attention_gpu(root),
        _models(cpu, cpu_where, cpu["dtype"]),
        _models(gpu, "GPU", f"{_gpu(root)}: {gpu['dtype']} autocast"),
    ]


def draw(root: Path) -> Path:
    """Draw docs/where_nystrom_wins.png from the committed data; its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, panel in zip(axes.flat, panels(root)):
        _panel(ax, panel)
    for ax in axes[1]:
        ax.set_xlabel("tokens n (log scale)")
    for ax in axes[:, 0]:
        ax.set_ylabel("ms per call (log scale)")
    fig.suptitle("Where Nyström wins: time per call against n (lower is faster)\ngreen: ours is the fastest line "
                 "(the crossing log-log interpolated between measured lengths); red: ours is slower", fontsize=10)  # fmt: skip
    lines = {}
    for ax in axes.flat:
        lines.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(lines.values(), lines.keys(), loc="lower center", ncol=2, fontsize=8.5, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    png = root / PNG
    fig.savefig(png, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return png
