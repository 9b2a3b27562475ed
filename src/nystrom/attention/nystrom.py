"""Nyström self-attention module (Xiong et al. 2021). Legend: b batch, h heads, n tokens, m landmarks, d head dim."""

from __future__ import annotations

import torch

from nystrom.attention.base import AttentionBase
from nystrom.ops.nystrom import PINV_METHODS, nystrom_attention
from nystrom.ops.pinv import PINV_INITS
from nystrom.utils.checks import check_choice, check_positive_int, check_scale


class NystromAttention(AttentionBase):
    """Multi-head Nyström self-attention: ``x (b, n, dim) -> (b, n, dim)`` in O(n) time and memory.

    Args:
        dim: model width.
        heads, dim_head: h and d.
        num_landmarks: m segment-means landmarks (n need not divide by m).
        pinv_iterations: iterations of the Moore–Penrose approximation.
        pinv_init: ``"per_matrix"`` (default; batch-independent) or ``"original"`` (public-code parity).
        pinv: ``"iterative"`` (the paper) or ``"exact"`` (SVD pseudo-inverse).
        conv_kernel_size: depthwise conv skip over V (odd), None = off. The paper uses 33 (LRA: 35).
        qkv_bias: bias on the q/k/v projection.
        dropout: dropout on the output projection.
        recompute: recompute q/k/v head by head in the backward instead of keeping them (peak training
            memory ≈ 3 instead of ≈ 7 (b, n, dim) tensors, ≈ 20 % more time; eager mode only).
        causal: must be False (raises): segment-means landmarks see the whole sequence.
        scale: the logit scale s of every softmax (F, A and B), None = 1/√d. A model made longer than it
            was trained sees more keys per softmax; s·log(N)/log(L) keeps its attention as sharp
            (log-length scaling; see docs/long-context.md).
    """

    name = "nystrom"
    head_separable = True
    key_bias_cancels = True

    @property
    def packs_documents(self) -> bool:  # type: ignore[override]
        """Packed documents are exact unless Z₀ is scaled by the whole batch (``pinv_init="original"``)."""
        return self.pinv_init == "per_matrix"

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 8,
        dim_head: int = 64,
        num_landmarks: int = 64,
        pinv_iterations: int = 6,
        pinv_init: str = "per_matrix",
        pinv: str = "iterative",
        conv_kernel_size: int | None = 33,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        recompute: bool = False,
        causal: bool = False,
        scale: float | None = None,
    ) -> None:
        if causal:
            raise ValueError(
                "causal=True is not supported by NystromAttention: segment-means landmarks mix future tokens"
                " into every output; the method is bidirectional. Use SoftmaxAttention for causal models."
            )
        super().__init__(
            dim,
            heads=heads,
            dim_head=dim_head,
            conv_kernel_size=conv_kernel_size,
            qkv_bias=qkv_bias,
            dropout=dropout,
            recompute=recompute,
        )
        self.num_landmarks = check_positive_int("num_landmarks", num_landmarks)
        self.pinv_iterations = check_positive_int("pinv_iterations", pinv_iterations, minimum=0)
        self.pinv_init = check_choice("pinv_init", pinv_init, PINV_INITS)
        self.pinv = check_choice("pinv", pinv, PINV_METHODS)
        self.scale = check_scale(scale)

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d)."""
        return self._nystrom(q, k, v, mask, None)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        conv_weight: torch.Tensor | None,
    ) -> torch.Tensor:
        """Heads (b, g, n, d) -> merged (b, n, g·d): the attention and its conv skip in one op call (the
        fused kernels add the skip in their query pass)."""
        return self._nystrom(q, k, v, mask, conv_weight).transpose(1, 2).flatten(2)

    def _nystrom(self, q, k, v, mask, conv_weight) -> torch.Tensor:
        return nystrom_attention(
            q, k, v, num_landmarks=self.num_landmarks, mask=mask, pinv_iterations=self.pinv_iterations,
            pinv=self.pinv, pinv_init=self.pinv_init, scale=self.scale, conv_weight=conv_weight,
            padded_finite=True,  # AttentionBase.forward zeroed x: padded q, k, v are the biases (finite)
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_landmarks={self.num_landmarks}, pinv={self.pinv}, "
            f"pinv_iterations={self.pinv_iterations}, pinv_init={self.pinv_init}"
            + ("" if self.scale is None else f", scale={self.scale}")
        )
