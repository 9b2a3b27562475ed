"""Metrics: a JSONL log (truncated on resume; read by :func:`nystrom_lab.data.records.read_metrics`),
optional TensorBoard, and a PNG of the curves."""

from __future__ import annotations

import json
from pathlib import Path

from nystrom_lab.data.records import METRICS_LOG, read_metrics


class MetricsLog:
    """Append-only JSONL of ``{"step", "split", ...}`` records; TensorBoard too when it is installed."""

    def __init__(self, out_dir: Path, *, enabled: bool = True, resume_step: int = 0) -> None:
        """``resume_step``: the checkpoint's step, whose lines up to it are kept; -1 for a fresh run (none kept)."""
        self.path = Path(out_dir) / METRICS_LOG
        self.enabled = enabled
        self.tb = None
        if not enabled:
            return
        if self.path.exists():  # drop what a killed run logged after its last checkpoint
            keep = [
                ln
                for ln in self.path.read_text().splitlines()
                if ln and json.loads(ln)["step"] <= resume_step
            ]
            self.path.write_text("".join(ln + "\n" for ln in keep))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(out_dir) / "tb"), purge_step=resume_step + 1)
        except Exception:
            self.tb = None

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(f"{record['split']}/{k}", v, record["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def plot_curves(metrics_path: Path, png_path: Path, *, title: str = "") -> Path:
    """Training loss and dev metrics vs step, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = read_metrics(metrics_path)
    train = [r for r in recs if r["split"] == "train"]
    dev = [r for r in recs if r["split"] == "dev"]
    keys = sorted(  # dev metrics other than the loss, which shares the first panel
        {k for r in dev for k, v in r.items() if isinstance(v, (int, float)) and k not in ("step", "time", "loss")}
    )
    panels = 1 + max(1, len(keys))
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], lw=1, label="train")
    if dev and "loss" in dev[0]:
        axes[0].plot([r["step"] for r in dev], [r["loss"] for r in dev], "o-", ms=3, label="dev")
    axes[0].set(xlabel="step", ylabel="loss", title="loss")
    axes[0].legend()
    for ax, k in zip(axes[1:], keys or ["-"]):
        pts = [(r["step"], r[k]) for r in dev if k in r]
        if pts:
            ax.plot(*zip(*pts), "o-", ms=3)
        ax.set(xlabel="step", ylabel=k, title=f"dev {k}")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return Path(png_path)
