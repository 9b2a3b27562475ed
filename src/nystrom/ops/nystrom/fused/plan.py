"""What the fused kernels read from the mask: every token's landmark and every landmark's token range.

Legend: b batch, n tokens, m landmarks.

The assignment is :func:`~nystrom.ops.nystrom.landmarks.landmark_assignment`'s (both segment rules). In
both, a landmark's real tokens are consecutive among the real tokens (rank and position are monotone), so
each landmark's tokens lie in one position range [start, end): the landmark kernel reads that range only,
and skips the padded positions inside it by their landmark index ``m``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nystrom.ops.nystrom.landmarks import landmark_assignment, shared


class Plan(NamedTuple):
    """The mask's part of a fused call, computed once per forward for all layers."""

    seg: torch.Tensor  # (b, n) int32: the token's landmark, m for padding
    bounds: torch.Tensor  # (b, m, 2) int32: [start, end) positions of the landmark's tokens (empty: n, 0)
    inv_count: torch.Tensor  # (b, m) float32: 1 / the landmark's real tokens, 0 for an empty landmark


def _compute(mask: torch.Tensor | None, b: int, n: int, m: int, segments: str, device: torch.device) -> Plan:
    seg, counts = landmark_assignment(mask, b, n, m, device, segments=segments)  # (b, n), (b, m) int64
    pos = torch.arange(n, device=device).expand(b, n)  # (b, n)
    start = torch.full((b, m + 1), n, dtype=torch.long, device=device).scatter_reduce_(1, seg, pos, "amin")
    end = torch.zeros(b, m + 1, dtype=torch.long, device=device).scatter_reduce_(1, seg, pos + 1, "amax")
    bounds = torch.stack((start[:, :m], end[:, :m]), -1).to(torch.int32)  # (b, m, 2)
    inv_count = torch.where(counts > 0, 1.0 / counts.clamp(min=1).float(), 0.0)  # (b, m)
    return Plan(seg.to(torch.int32), bounds, inv_count)


def plan(mask: torch.Tensor | None, b: int, n: int, m: int, segments: str, device: torch.device) -> Plan:
    """The :class:`Plan` for ``mask`` (b, n) or no mask, shared within a ``shared_landmarks`` block."""
    return shared(mask, ("fused", b, n, m, segments, device), lambda: _compute(mask, b, n, m, segments, device))
