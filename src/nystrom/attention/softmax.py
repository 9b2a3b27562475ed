"""Exact softmax self-attention module (the Transformer baseline). Legend: b batch, h heads, n tokens, d head dim."""

from __future__ import annotations

import torch

from nystrom.attention.base import AttentionBase
from nystrom.ops.softmax import softmax_attention
from nystrom.ops.softmax.block_diagonal import block_diagonal_attention
from nystrom.utils.checks import check_positive_int, check_scale


class SoftmaxAttention(AttentionBase):
    """Multi-head exact softmax self-attention (SDPA): ``x (b, n, dim) -> (b, n, dim)``.

    ``conv_kernel_size`` adds the Nyströmformer's depthwise conv skip on V; HF Nystromformer checkpoints run
    exactly this (softmax + conv) when their config sets num_landmarks == segment_means_seq_len.
    ``block_size`` w restricts every token to its own block of w tokens (block-diagonal attention,
    :func:`~nystrom.ops.softmax.block_diagonal.block_diagonal_attention`): a long model of copied positions
    then computes what its source computes on each block alone. ``scale``: the logit scale, None = 1/√d.
    """

    name = "softmax"
    head_separable = True
    packs_documents = True
    key_bias_cancels = True

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 8,
        dim_head: int = 64,
        conv_kernel_size: int | None = None,
        block_size: int | None = None,
        scale: float | None = None,
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
        if block_size is not None:
            check_positive_int("block_size", block_size)
        self.block_size = block_size
        self.scale = check_scale(scale)

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d)."""
        if self.block_size is not None:
            return block_diagonal_attention(q, k, v, block_size=self.block_size, mask=mask, scale=self.scale)
        # AttentionBase.forward zeroed x: padded q, k, v are the projections' biases (finite)
        return softmax_attention(q, k, v, mask=mask, scale=self.scale, padded_finite=True)

    def extra_repr(self) -> str:
        extra = "" if self.block_size is None else f", block_size={self.block_size}"
        return super().extra_repr() + extra + ("" if self.scale is None else f", scale={self.scale}")
