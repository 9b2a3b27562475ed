"""Exact softmax self-attention module (the Transformer baseline). Legend: b batch, h heads, n tokens, d head dim."""

from __future__ import annotations

import torch

from nystrom.attention.base import AttentionBase
from nystrom.functional.attention import softmax_attention


class SoftmaxAttention(AttentionBase):
    """Multi-head exact softmax self-attention (fused SDPA): ``x (b, n, dim) -> (b, n, dim)``.

    ``conv_kernel_size`` adds the Nyströmformer's depthwise conv skip on V; HF Nystromformer checkpoints run
    exactly this (softmax + conv) when their config sets num_landmarks == segment_means_seq_len.
    """

    name = "softmax"
    head_separable = True

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 8,
        dim_head: int = 64,
        conv_kernel_size: int | None = None,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        recompute: bool = False,
    ) -> None:
        super().__init__(
            dim,
            heads=heads,
            dim_head=dim_head,
            conv_kernel_size=conv_kernel_size,
            qkv_bias=qkv_bias,
            dropout=dropout,
            recompute=recompute,
        )

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d)."""
        return softmax_attention(q, k, v, mask=mask)
