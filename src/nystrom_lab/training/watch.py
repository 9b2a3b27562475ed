"""The loop's training-loss bookkeeping: sums, the first non-finite step and throughput, without a host
sync per step."""

from __future__ import annotations

import torch


class LossWatch:
    """Training-loss bookkeeping without a host sync per step.

    The loss of every step is summed on the device; the first step whose loss is not finite is
    recorded there too (with the learning rates of the window on the host). :meth:`check` reads both
    once: at the logging interval, before an evaluation or checkpoint, and when the forward raises (a
    diverged run's NaN weights make attention complain one step later: the loop's message comes first).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.lrs: dict[int, float] = {}
        self.reset()

    def reset(self) -> None:
        self.loss = torch.zeros((), device=self.device)
        self.first_bad = torch.full((), -1, dtype=torch.long, device=self.device)
        self.steps, self.tokens, self.lrs = 0, 0, {}

    def add(self, step: int, loss: torch.Tensor, lr: float, tokens: int) -> None:
        self.lrs[step] = lr
        bad = ~torch.isfinite(loss) & (self.first_bad < 0)
        self.first_bad = torch.where(bad, torch.full_like(self.first_bad, step), self.first_bad)
        self.loss += loss
        self.steps += 1
        self.tokens += tokens

    def check(self, precision: str) -> None:
        step = int(self.first_bad)
        if step >= 0:
            hint = "" if precision == "fp32" else f", or try --precision fp32 instead of {precision}"
            raise FloatingPointError(
                f"non-finite training loss at step {step + 1} (learning rate {self.lrs[step]:.3g}); "
                f"the run diverged: lower --lr or lengthen --warmup{hint}"
            )

    def mean_loss(self) -> float:
        return float(self.loss) / max(self.steps, 1)


def count_tokens(batch: dict) -> int:
    """Real tokens of a collated CPU batch (its attention mask, else its ids; 0 when it has neither)."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return int(mask.sum())
    ids = batch.get("input_ids")
    return ids.numel() if isinstance(ids, torch.Tensor) else 0
