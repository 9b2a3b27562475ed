"""Figure 5, scaled down: dev MLM (and SOP) accuracy vs step of several ``nystrom pretrain`` runs in one
PNG, plus a markdown table of the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

from nystrom.training.logging import read_metrics

METRICS = ("mlm_accuracy", "sop_accuracy")


def _label(run: Path) -> str:
    info = run / "pretrain_run.json"
    return json.loads(info.read_text())["attention"] if info.is_file() else run.name


def dev_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` of the dev evaluations in ``run/metrics.jsonl``."""
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run} a `nystrom pretrain` output folder?")
    dev = [r for r in read_metrics(path) if r["split"] == "dev"]
    if not dev:
        raise ValueError(f"{path} holds no dev evaluation yet")
    return {m: [(r["step"], r[m]) for r in dev if m in r] for m in METRICS}


def compare_runs(runs: list[Path], png: Path, table: Path | None = None) -> str:
    """Draw the runs' dev curves (one panel per metric) into ``png``; return (and write to ``table``) the
    markdown table ``step | <run> MLM | <run> SOP | ...``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {_label(Path(r)): dev_curves(Path(r)) for r in runs}
    if len(curves) != len(runs):
        raise ValueError(f"runs must have distinct attention labels, got {[_label(Path(r)) for r in runs]}")
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5.2 * len(METRICS), 3.8))
    for ax, metric in zip(axes, METRICS):
        for label, c in curves.items():
            if c[metric]:
                ax.plot(*zip(*c[metric]), "o-", ms=3, label=label)
        ax.set(xlabel="step", ylabel=f"dev {metric.replace('_', ' ')}", title=metric.split("_")[0].upper())
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("MLM / SOP validation accuracy (scaled-down Fig. 5)")
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    steps = sorted({s for c in curves.values() for s, _ in c["mlm_accuracy"]})
    head = "| step | " + " | ".join(f"{lab} MLM acc | {lab} SOP acc" for lab in curves) + " |"
    rows = [head, "|---:|" + "---:|" * (2 * len(curves))]
    for s in steps:
        cells = []
        for c in curves.values():
            for metric in METRICS:
                val = dict(c[metric]).get(s)
                cells.append("" if val is None else f"{val:.4f}")
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    text = "\n".join(rows) + "\n"
    if table is not None:
        Path(table).write_text(text)
    return text
