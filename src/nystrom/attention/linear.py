"""ELU linear attention module (Katharopoulos et al. 2020). Legend: b batch, h heads, n tokens, d head dim."""

from __future__ import annotations

import torch

from nystrom.attention.base import AttentionBase
from nystrom.ops.baselines.linear import linear_attention


class LinearAttention(AttentionBase):
    """Non-causal linear attention with the feature map ``elu(x) + 1``: O(n·d²) time, O(n) memory.

    ``out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / phi(q_i)^T sum_j phi(k_j)``, the sums over real tokens
    only (see :mod:`nystrom.ops.baselines.linear`). No options beyond the shell's: the method has none.

    Args:
        dim: model width.
        heads, dim_head: h and d.
        qkv_bias, dropout, recompute: as in :class:`AttentionBase`.
    """

    name = "linear"
    head_separable = True

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 8,
        dim_head: int = 64,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        recompute: bool = False,
    ) -> None:
        super().__init__(
            dim, heads=heads, dim_head=dim_head, qkv_bias=qkv_bias, dropout=dropout, recompute=recompute
        )

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d)."""
        return linear_attention(q, k, v, mask=mask)
