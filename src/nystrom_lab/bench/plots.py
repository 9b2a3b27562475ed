"""PNG figures of the benchmarks (matplotlib, Agg backend, no display needed).

Legend: n tokens, m landmarks (or the method's budget: projection length, window, features, keys per bucket).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    import torch  # only Figure 3 takes tensors: the row plots re-draw from data files without torch


def plot_table1(rows: list[dict], path: Path, *, title: str) -> None:
    """Log-log time (ms) and memory (MB) vs n, one line per method; rows as from ``table1.run``."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for label in labels:
        pts = sorted((r["n"], r["ms"], r["peak_mb"]) for r in rows if r["label"] == label and "ms" in r)
        if not pts:
            continue
        ns = [p[0] for p in pts]
        style = "--" if label in ("Transformer", "SDPA (fused exact)") else "-"
        axes[0].plot(ns, [p[1] for p in pts], style, marker="o", label=label)
        axes[1].plot(ns, [max(p[2], 1e-1) for p in pts], style, marker="o", label=label)
    for ax, ylabel in zip(axes, ("time (ms)", "peak memory above input (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_approx(rows: list[dict], path: Path, *, families: list[tuple[str, int]]) -> None:
    """Relative error vs budget (log-log), one panel per (family, n), one line per method; the
    ``uniform`` baseline (mean of v) is a horizontal dashed line."""
    fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 4.5), squeeze=False)
    for ax, (family, n) in zip(axes[0], families):
        sub = [r for r in rows if r["family"] == family and r["n"] == n]
        for method in dict.fromkeys(r["method"] for r in sub):
            pts = sorted((r["param"], r["rel_err"]) for r in sub if r["method"] == method)
            if method == "uniform":
                ax.axhline(pts[0][1], color="grey", ls="--", label="uniform (mean of v)")
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("m landmarks / projection / window / features / keys per bucket")
        ax.set_ylabel("relative error ‖Ŷ−Y‖_F / ‖Y‖_F")
        ax.set_title(f"{family}, n={n}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention_maps(exact: torch.Tensor, approx: torch.Tensor, path: Path, *, title: str) -> None:
    """The paper's Figure 3: exact softmax matrix (n, n) next to its Nyström approximation F·A⁺·B (n, n)
    and their absolute difference; one colour scale (0 to the exact matrix's 99.5th percentile)."""
    import torch

    ex, ap = exact.detach().float().cpu(), approx.detach().float().cpu()
    if ex.dim() != 2 or ex.shape[0] != ex.shape[1] or ex.shape != ap.shape:
        raise ValueError(f"exact and approx must both be (n, n), got {tuple(ex.shape)} and {tuple(ap.shape)}")
    vmax = float(torch.quantile(ex.flatten()[:: max(1, ex.numel() // 1_000_000)], 0.995))
    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    panels = (
        (ex, "exact softmax(QKᵀ/√d)"),
        (ap, "Nyström F·A⁺·B"),
        ((ex - ap).abs(), "|exact − Nyström|"),
    )
    for ax, (mat, name) in zip(axes, panels):
        im = ax.imshow(mat.numpy(), cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
