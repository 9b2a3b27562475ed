"""The outside Nyström modules every benchmark compares with, each built in one place: transformers'
``NystromformerSelfAttention`` and lucidrains' ``nystrom_attention.NystromAttention``.

Legend: b batch, h heads, n tokens, d head dim, e = h·d model width, m landmarks, K conv kernel.

The packages are imported on the first build only (the benchmarks' report writers stay import-light);
a missing one stops the caller with the pip line that installs it.
"""

from __future__ import annotations

import torch
from torch import nn


def hf_nystrom_self_attention(
    e: int, *, heads: int, landmarks: int, n: int, conv_kernel: int | None = None
) -> nn.Module:
    """transformers' ``NystromformerSelfAttention`` for inputs of exactly n tokens (its segment means are
    sized for n, so n must be a multiple of m): (b, n, e) -> a tuple whose first item is (b, n, e).

    ``conv_kernel`` None: no conv skip, alike for every implementation compared (its config only takes an
    int, so the field is set on the module, and the unused conv is dropped)."""
    try:
        from transformers import NystromformerConfig
        from transformers.models.nystromformer.modeling_nystromformer import NystromformerSelfAttention
    except ImportError as err:
        raise SystemExit("the 'hf' implementation needs transformers: pip install -e '.[test]'") from err
    if n % landmarks:
        raise ValueError(f"HF's Nystromformer needs n divisible by m (n={n}, m={landmarks})")
    cfg = NystromformerConfig(hidden_size=e, num_attention_heads=heads, num_landmarks=landmarks,
                              segment_means_seq_len=n, attention_probs_dropout_prob=0.0)  # fmt: skip
    if conv_kernel is not None:
        cfg.conv_kernel_size = conv_kernel
    attn = NystromformerSelfAttention(cfg)
    attn.conv_kernel_size = conv_kernel
    if conv_kernel is None:
        del attn.conv
    return attn


class HFSelfAttention(nn.Module):
    """transformers' self-attention + an output projection and dropout, our modules' call: (b, n, e) ->
    (b, n, e). transformers puts that projection in ``NystromformerSelfOutput``, with a LayerNorm and a
    residual that ours has not."""

    def __init__(
        self,
        e: int,
        *,
        heads: int,
        landmarks: int,
        n: int,
        conv_kernel: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.attn = hf_nystrom_self_attention(
            e, heads=heads, landmarks=landmarks, n=n, conv_kernel=conv_kernel
        )
        self.out = nn.Linear(e, e)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.out(self.attn(x)[0]))


def lucidrains_nystrom_attention(
    *,
    dim: int,
    dim_head: int = 64,
    heads: int = 8,
    num_landmarks: int = 256,
    pinv_iterations: int = 6,
    residual: bool = True,
    residual_conv_kernel: int = 33,
    dropout: float = 0.0,
) -> nn.Module:
    """lucidrains' ``NystromAttention`` with its own keyword options and defaults (so it also stands where a
    class of that API is asked for): (b, n, e) -> (b, n, e)."""
    try:
        from nystrom_attention import NystromAttention
    except ImportError as err:
        raise SystemExit(
            "the 'lucidrains' implementation needs nystrom-attention: pip install -e '.[test]'"
        ) from err
    return NystromAttention(dim=dim, dim_head=dim_head, heads=heads, num_landmarks=num_landmarks,
                            pinv_iterations=pinv_iterations, residual=residual,
                            residual_conv_kernel=residual_conv_kernel, dropout=dropout)  # fmt: skip


def lucidrains_layer(
    e: int, *, heads: int, dim_head: int, landmarks: int, conv_kernel: int | None = None, dropout: float = 0.0
) -> nn.Module:
    """lucidrains' module configured as our :class:`~nystrom.attention.NystromAttention` is by default (its
    pinv iterations; the conv skip, of kernel ``conv_kernel``, only where asked): (b, n, e) -> (b, n, e)."""
    from nystrom_lab.attention_spec import constructor_default

    return lucidrains_nystrom_attention(
        dim=e, dim_head=dim_head, heads=heads, num_landmarks=landmarks,
        pinv_iterations=constructor_default("nystrom", "pinv_iterations"), residual=conv_kernel is not None,
        residual_conv_kernel=conv_kernel or constructor_default("nystrom", "conv_kernel_size"), dropout=dropout,
    )  # fmt: skip
