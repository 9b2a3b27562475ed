"""The official LRA / BERT schedule: linear warm-up to the peak rate, then linear decay to zero."""

from __future__ import annotations

import torch


def linear_warmup_decay(step: int, *, warmup: int, total: int) -> float:
    """Multiplier of the peak learning rate at optimiser step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def make_scheduler(
    optimizer: torch.optim.Optimizer, *, warmup: int, total: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: linear_warmup_decay(s, warmup=warmup, total=total)
    )
