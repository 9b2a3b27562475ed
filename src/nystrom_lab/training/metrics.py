"""Evaluation metrics of sequence classification and regression, from all logits and labels of a split.

Legend: N examples, c classes.

Single-label: ``accuracy``, ``macro_f1`` (mean of the per-class F1s), ``matthews`` (multi-class MCC,
as sklearn), and for two classes ``f1`` (of class 1: GLUE's MRPC/QQP metric). Multi-label (a sigmoid
per class, threshold 0.5): ``accuracy`` (all classes right), ``macro_f1``, ``micro_f1``. Regression:
``pearson``, ``spearman`` (ties get their average rank), ``mse``. An undefined score (no variance, no
positive) is 0.0, so logs stay valid JSON.
"""

from __future__ import annotations

import numpy as np
import torch

PROBLEM_METRICS = {
    "single_label_classification": ("accuracy", "macro_f1", "matthews", "f1"),
    "multi_label_classification": ("accuracy", "macro_f1", "micro_f1"),
    "regression": ("pearson", "spearman", "mse"),
}
DEFAULT_METRIC = {
    "single_label_classification": "accuracy",
    "multi_label_classification": "macro_f1",
    "regression": "pearson",
}
MINIMISED = ("mse", "loss")


def _f1(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    den = 2 * tp + fp + fn
    return np.where(den > 0, 2 * tp / np.maximum(den, 1), 0.0)


def _confusion(pred: np.ndarray, gold: np.ndarray, c: int) -> np.ndarray:
    return np.bincount(gold * c + pred, minlength=c * c).reshape(c, c)  # rows: gold, columns: predicted


def single_label_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """logits (N, c), labels (N,) class ids."""
    c = logits.shape[-1]
    pred, gold = logits.argmax(-1).numpy(), labels.long().numpy()
    cm = _confusion(pred, gold, c).astype(np.float64)
    tp = np.diag(cm)
    fp, fn = cm.sum(0) - tp, cm.sum(1) - tp
    s, t, p = cm.sum(), cm.sum(1), cm.sum(0)
    den = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    out = {
        "accuracy": float(tp.sum() / max(s, 1)),
        "macro_f1": float(_f1(tp, fp, fn).mean()),
        "matthews": float((tp.sum() * s - t @ p) / den) if den > 0 else 0.0,
    }
    if c == 2:
        out["f1"] = float(_f1(tp[1], fp[1], fn[1]))
    return out


def multi_label_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """logits (N, c), labels (N, c) multi-hot."""
    pred, gold = (logits > 0).numpy(), labels.numpy() > 0.5  # sigmoid(x) > 0.5 <=> x > 0
    tp, fp, fn = (pred & gold).sum(0), (pred & ~gold).sum(0), (~pred & gold).sum(0)
    return {
        "accuracy": float((pred == gold).all(1).mean()),
        "macro_f1": float(_f1(tp, fp, fn).mean()),
        "micro_f1": float(_f1(tp.sum(), fp.sum(), fn.sum())),
    }


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(len(x))
    xs = x[order]
    first = np.r_[True, xs[1:] != xs[:-1]]
    dense = first.cumsum()[inv]
    bounds = np.r_[np.nonzero(first)[0], len(x)]
    return 0.5 * (bounds[dense] + bounds[dense - 1] + 1)


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = np.sqrt((a @ a) * (b @ b))
    return float(a @ b / den) if den > 0 else 0.0


def regression_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """logits (N, 1) or (N,), labels (N,)."""
    pred, gold = logits.reshape(-1).double().numpy(), labels.reshape(-1).double().numpy()
    return {
        "pearson": _pearson(pred, gold),
        "spearman": _pearson(_average_ranks(pred), _average_ranks(gold)),
        "mse": float(((pred - gold) ** 2).mean()) if len(pred) else 0.0,
    }


def task_metrics(problem_type: str, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """The metrics of ``problem_type`` (transformers' names) for a whole split."""
    fn = {
        "single_label_classification": single_label_metrics,
        "multi_label_classification": multi_label_metrics,
        "regression": regression_metrics,
    }[problem_type]
    return fn(logits.float().cpu(), labels.cpu())


def check_metric(metric: str, problem_type: str, num_labels: int) -> None:
    """Refuse a selection metric the task does not report."""
    allowed = [m for m in PROBLEM_METRICS[problem_type] if m != "f1" or num_labels == 2] + ["loss"]
    if metric not in allowed:
        raise ValueError(
            f"--metric {metric!r} is not reported for {problem_type} with {num_labels} label(s); choose one of {allowed}"
            + (
                " (f1 is the F1 of class 1 of a two-class task; macro_f1 averages all classes)"
                if metric == "f1"
                else ""
            )
        )
