"""Dev curves and run summaries read from ``nystrom pretrain`` logs (``metrics.jsonl``): what Figure 5's
report, ``nystrom plot-runs`` and the rendered docs tables show. Reads files only (no torch)."""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.data.records import METRICS_LOG, read_metrics

METRICS = ("mlm_accuracy", "sop_accuracy")


def dev_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` of the dev evaluations in ``run/metrics.jsonl``."""
    path = Path(run) / METRICS_LOG
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run} a `nystrom pretrain` output folder?")
    dev = [r for r in read_metrics(path) if r["split"] == "dev"]
    if not dev:
        raise ValueError(f"{path} holds no dev evaluation yet")
    return curves_of(dev)


def curves_of(dev: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` of a log's dev records."""
    return {m: [(r["step"], r[m]) for r in dev if m in r] for m in METRICS}


def curves_table(curves: dict[str, dict[str, list[tuple[int, float]]]]) -> str:
    """Markdown ``step | <run> MLM acc | <run> SOP acc | ...``: every run's dev values at every step any
    run was evaluated at (blank where a run has none)."""
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
    return "\n".join(rows) + "\n"


def wall_time(train_records: list[dict]) -> float:
    """Seconds of training + evaluation over all (resumed) segments of a run: the loop's ``time`` restarts
    at 0 in each process, so sum each segment's last value."""
    total, prev = 0.0, 0.0
    for r in train_records:
        t = float(r.get("time", 0.0))
        if t < prev:
            total += prev
        prev = t
    return total + prev


def dev_summary(dev: list[dict]) -> dict:
    """The final and best dev MLM accuracy (the earliest step on a tie) and the SOP accuracies, as
    ``results.json`` reports them; empty before the first evaluation."""
    if not dev:
        return {}
    best = max(dev, key=lambda r: (r["mlm_accuracy"], -r["step"]))
    return dict(
        final_mlm_accuracy=dev[-1]["mlm_accuracy"], final_sop_accuracy=dev[-1]["sop_accuracy"],
        best_mlm_accuracy=best["mlm_accuracy"], best_step=best["step"],
        sop_accuracy_at_best=best["sop_accuracy"], best_sop_accuracy=max(r["sop_accuracy"] for r in dev),
        final_dev_step=dev[-1]["step"],
    )  # fmt: skip
