"""Longformer sliding-window attention module (Beltagy et al. 2020).

Legend: b batch, h heads, n tokens, d head dim, w window size.
"""

from __future__ import annotations

import torch

from nystrom.attention.base import AttentionBase
from nystrom.ops.baselines.longformer import sliding_window_attention
from nystrom.utils.checks import check_positive_int


class LongformerAttention(AttentionBase):
    """Local self-attention over a centred window of w tokens, O(n·w) time and memory.

    No global tokens. The padding mask is honoured exactly (see :mod:`nystrom.ops.baselines.longformer`).

    Args:
        dim: model width.
        heads, dim_head: h and d.
        window_size: odd w = 2r + 1; 257 (128 each side + self) is the Nyströmformer paper's setting.
        qkv_bias, dropout: as in :class:`AttentionBase`.
    """

    name = "longformer"
    packs_documents = True  # a window past a document's end sees masked padding, as alone it sees nothing

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 8,
        dim_head: int = 64,
        window_size: int = 257,
        qkv_bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(dim, heads=heads, dim_head=dim_head, qkv_bias=qkv_bias, dropout=dropout)
        check_positive_int("window_size", window_size)
        if window_size % 2 == 0:
            raise ValueError(f"window_size must be odd (2 * radius + 1), got {window_size}")
        self.window_size = window_size

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d)."""
        return sliding_window_attention(q, k, v, window_size=self.window_size, mask=mask)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window_size={self.window_size}"
