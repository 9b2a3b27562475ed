"""Linformer attention module (Wang et al. 2020).

Legend: b batch, h heads, n tokens, d head dim, p projection length, N ``max_seq_len``.
"""

from __future__ import annotations

import torch
from torch import nn

from nystrom.attention.base import AttentionBase
from nystrom.ops.baselines.linformer import linformer_attention
from nystrom.utils.checks import check_positive_int


class LinformerAttention(AttentionBase):
    """Linformer self-attention: keys/values projected along the sequence by learned E, F (p, N).

    E and F are shared by all heads (the paper's headwise sharing) and initialised Xavier-normal as a
    linear map N -> p. Linformer is tied to ``max_seq_len``: an input of n <= N tokens uses the first n
    columns, a longer one raises ``ValueError``. Padded keys/values are zeroed before the projection,
    which removes their contribution exactly (see :mod:`nystrom.ops.baselines.linformer`).

    Args:
        dim: model width.
        heads, dim_head: h and d.
        max_seq_len: N, the longest input the module accepts (required).
        proj_len: p, Linformer's projection length k (256 in the Nyströmformer paper's comparisons).
        qkv_bias, dropout: as in :class:`AttentionBase`.
    """

    name = "linformer"

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 8,
        dim_head: int = 64,
        max_seq_len: int,
        proj_len: int = 256,
        qkv_bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(dim, heads=heads, dim_head=dim_head, qkv_bias=qkv_bias, dropout=dropout)
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        self.proj_len = check_positive_int("proj_len", proj_len)
        self.e = nn.Parameter(torch.empty(proj_len, max_seq_len))  # (p, N) key projection
        self.f = nn.Parameter(torch.empty(proj_len, max_seq_len))  # (p, N) value projection
        nn.init.xavier_normal_(self.e)
        nn.init.xavier_normal_(self.f)

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d); raises ``ValueError`` if n > ``max_seq_len``."""
        return linformer_attention(q, k, v, self.e, self.f, mask=mask)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_seq_len={self.max_seq_len}, proj_len={self.proj_len}"
