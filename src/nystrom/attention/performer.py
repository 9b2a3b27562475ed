"""Performer FAVOR+ attention module (Choromanski et al. 2020).

Legend: b batch, h heads, n tokens, d head dim, m random features.
"""

from __future__ import annotations

import torch

from nystrom.attention.base import AttentionBase
from nystrom.ops.baselines.performer import orthogonal_random_features, performer_attention
from nystrom.utils.checks import check_positive_int


class PerformerAttention(AttentionBase):
    """Softmax attention approximated by m positive orthogonal random features, O(n·m·d).

    The projection W (m, d) is a persistent buffer ``projection`` (saved in the state dict, so a
    checkpoint reproduces its outputs) drawn from ``seed``; all heads share it. Call
    :meth:`redraw_projection` to draw a fresh one (e.g. every k training steps, as the paper suggests).
    Padded keys get zero features, which removes them exactly.

    Args:
        dim: model width.
        heads, dim_head: h and d.
        num_features: m (256 in the Nyströmformer paper's comparisons).
        seed: seed of the initial draw of W.
        qkv_bias, dropout: as in :class:`AttentionBase`.
    """

    name = "performer"

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 8,
        dim_head: int = 64,
        num_features: int = 256,
        seed: int = 0,
        qkv_bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(dim, heads=heads, dim_head=dim_head, qkv_bias=qkv_bias, dropout=dropout)
        self.num_features = check_positive_int("num_features", num_features)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {seed!r}")
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("projection", orthogonal_random_features(num_features, dim_head, generator=gen))

    @torch.no_grad()
    def redraw_projection(self, seed: int | None = None) -> None:
        """Redraw W in place (keeping its dtype/device): from ``seed``, or from torch's global RNG if None."""
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        self.projection.copy_(orthogonal_random_features(self.num_features, self.dim_head, generator=gen))

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d)."""
        return performer_attention(q, k, v, self.projection, mask=mask)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_features={self.num_features}"
