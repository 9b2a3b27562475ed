"""One LRA ListOps training step with our attention, or the same model with lucidrains' attention.

Legend: b batch, n tokens (ListOps: 500..2000 real tokens, padded to the longest).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from nystrom.attention import NystromAttention
from nystrom_lab.bench.comparisons import lucidrains_layer


class _LucidLayer(nn.Module):
    """lucidrains' attention behind our layer call ``(x, mask)`` (mask True = real token, as theirs)."""

    def __init__(self, ours: NystromAttention) -> None:
        super().__init__()
        self.lucid = lucidrains_layer(
            ours.dim,
            heads=ours.heads,
            dim_head=ours.dim_head,
            landmarks=ours.num_landmarks,
            conv_kernel=ours.conv_kernel_size,
            dropout=ours.dropout.p,
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.lucid(x, mask=mask)


def listops_step(attention: str, *, batch: int, length: int) -> Callable[[], tuple[float]]:
    """One AdamW training step of the LRA ListOps model (official preset) with ``attention`` =
    ``"nystrom"`` (ours) or ``"lucidrains"`` (every attention layer swapped for theirs); returns its ms."""
    from nystrom_lab.lra.experiment import LRARun, build_model, classification_step

    model = build_model(LRARun(task="listops", max_length=length)).train()
    if attention == "lucidrains":
        for name, mod in list(model.named_modules()):
            if isinstance(mod, NystromAttention):
                parent, _, leaf = name.rpartition(".")
                setattr(model.get_submodule(parent), leaf, _LucidLayer(mod))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(length // 4, length + 1, (batch,), generator=gen)  # ListOps: 500..2000
    mask = torch.arange(length)[None, :] < lengths[:, None]
    ids = torch.randint(1, model.config.vocab_size, (batch, length), generator=gen) * mask
    data = {
        "input_ids": ids,
        "attention_mask": mask.long(),
        "labels": torch.randint(0, 10, (batch,), generator=gen),
    }

    def step() -> tuple[float]:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, _ = classification_step(model, data)
        loss.backward()
        opt.step()
        return (1e3 * (time.perf_counter() - t0),)

    return step
