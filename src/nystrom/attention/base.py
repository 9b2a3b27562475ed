"""The one interface every attention variant implements.

Legend: b batch, n tokens, h heads, d head dim, e model dim (``dim``).

A variant subclasses :class:`AttentionBase` and implements :meth:`AttentionBase.core`, which maps
per-head ``q, k, v`` of shape ``(b, h, n, d)`` to ``(b, h, n, d)``. The base owns the joint q/k/v
projection, the output projection, dropout and input validation, so every variant is constructed as
``cls(dim, *, heads, dim_head, <variant options>)`` and called as ``forward(x, mask=None)`` with ``mask`` True = real token.

Packed documents (``forward(x, mask, cu_seqlens=...)``): the base turns the heads of every document into a
sample of its own (:mod:`nystrom.ops.plan.documents`) around the variant's ``attend``, so a variant whose
padding is exact packs exactly; those declare ``packs_documents = True``, the others refuse packed input.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

from nystrom.attention.recompute import Attend, recompute_attention
from nystrom.layers.dense import dense_module
from nystrom.layers.dropout import Dropout
from nystrom.layers.projection import project_heads
from nystrom.ops.conv import add_conv_skip
from nystrom.ops.plan import (
    Documents,
    is_packed,
    packed_plan,
    padding,
    rows_from_documents,
    shared_plan,
    split_documents,
)
from nystrom.utils.checks import (
    check_dtype_matches,
    check_mask,
    first_order_only,
    rejects_key_padding_mask,
)


class AttentionBase(nn.Module):
    """Multi-head self-attention shell: ``x (b, n, e) -> (b, n, e)``.

    Args:
        dim: model width e.
        heads: number of heads h.
        dim_head: per-head width d.
        conv_kernel_size: odd kernel length of the depthwise convolution of V over the sequence that is
            added to the attention output as a skip connection (the paper's), or None for none.
        qkv_bias: whether the q/k/v projection has a bias (BERT/HF checkpoints do).
        dropout: dropout on the output projection.
        recompute: keep only ``x`` for the backward and recompute q/k/v there, a group of heads at a
            time (see ``attention/recompute.py``): peak training memory ≈ 3 instead of ≈ 7 (b, n, e)
            tensors, for ≈ 20 % more time. Eager mode only; variants whose heads are not independent
            (or whose core is random) refuse it.
    """

    #: the registry name of the variant (set by subclasses)
    name: str = ""
    #: whether ``core`` treats heads independently and deterministically (``recompute=True`` needs it)
    head_separable: bool = False
    #: whether padding is exact for ``core`` (a sample's real outputs do not depend on its padded length),
    #: so that packed documents, run as padded samples of their own, get exactly what they get alone
    packs_documents: bool = False
    #: whether ``core`` uses k only in softmaxes over keys (or over means of keys): k's bias then adds the
    #: same q·b to a row's scores and cancels, and the export leaves it out (layers.projection.project_heads)
    key_bias_cancels: bool = False

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
        super().__init__()
        for arg, val in (("dim", dim), ("heads", heads), ("dim_head", dim_head)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{arg} must be a positive int, got {val!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if not isinstance(recompute, bool):
            raise TypeError(f"recompute must be a bool, got {recompute!r}")
        if recompute and not self.head_separable:
            raise ValueError(
                f"recompute=True needs a core whose heads are independent and deterministic; "
                f"{type(self).__name__} is not (supported: nystrom, softmax, linear)"
            )
        self.dim, self.heads, self.dim_head = dim, heads, dim_head
        self.recompute = recompute
        inner = heads * dim_head
        self.qkv = nn.Linear(dim, 3 * inner, bias=qkv_bias)  # one GEMM for q, k and v
        self.out = nn.Linear(inner, dim)
        self.dropout = Dropout(dropout)
        self.conv_kernel_size = conv_kernel_size
        self.conv: nn.Conv2d | None = None
        if conv_kernel_size is not None:
            if not isinstance(conv_kernel_size, int) or conv_kernel_size < 1 or conv_kernel_size % 2 == 0:
                raise ValueError(
                    f"conv_kernel_size must be an odd positive int or None, got {conv_kernel_size!r}"
                )
            # (h, 1, k, 1) weights: the layout of HF's `attention.self.conv.weight`, one filter per head.
            self.conv = nn.Conv2d(
                heads,
                heads,
                (conv_kernel_size, 1),
                padding=(conv_kernel_size // 2, 0),
                groups=heads,
                bias=False,
            )

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Per-head attention ``(b, h, n, d) x3 -> (b, h, n, d)``; ``mask`` (b, n) bool, True = real."""
        raise NotImplementedError

    @rejects_key_padding_mask
    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> torch.Tensor:
        """``x`` (b, n, dim) -> (b, n, dim).

        ``mask`` (b, n) bool, True = real token (transformers' and lucidrains' convention; the opposite
        of ``nn.MultiheadAttention``'s ``key_padding_mask``). Padded positions of ``x`` may hold any
        values, NaN and Inf included: no real output and no gradient depends on them.

        ``cu_seqlens``: packed documents, FlashAttention's int32 (documents + 1,) offsets into the b·n
        tokens read row after row (every row starts a document); each attends only to itself and gets
        what it gets alone. ``max_seqlen``: its longest document, if known (saves a host read). See
        :func:`~nystrom.ops.nystrom.dispatch.nystrom_attention`.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (batch, tokens, {self.dim}), got {shape}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
        check_dtype_matches(x, self.qkv.weight)
        b, n, _ = x.shape
        mask = check_mask(mask, b, n, x.device)
        packed = is_packed(cu_seqlens, max_seqlen)  # max_seqlen alone raises
        if packed and not self.packs_documents:
            raise ValueError(
                f"{type(self).__name__} cannot honour packed documents (cu_seqlens): its output depends on "
                "a sample's padded length or its batch-mates, so a document would not get what it gets "
                "alone. Use nystrom (pinv_init='per_matrix') or softmax attention, or feed the documents "
                "unpacked"
            )
        with contextlib.nullcontext() if torch.compiler.is_compiling() else shared_plan(mask, cu_seqlens):
            documents = None
            if packed:  # once per forward inside a model's block
                documents = packed_plan(cu_seqlens, mask, b, n, x.device, max_seqlen=max_seqlen)
            return self._forward(x, mask, documents)

    def _forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, documents: Documents | None
    ) -> torch.Tensor:
        # Inside a shared_plan block (the model's, or one of its own): ~mask and what the core derives
        # from the mask are computed once however often the layer uses them.
        if mask is not None:  # zeroed, not only masked later: 0 · NaN in the weight gradient would be NaN
            x = x.masked_fill(padding(mask)[..., None], 0)
        attend = self.attend if documents is None else functools.partial(self._attend_documents, documents)
        if self.recompute and torch.is_grad_enabled() and (x.requires_grad or self.qkv.weight.requires_grad):
            y = recompute_attention(
                x, mask, self.qkv.weight, self.qkv.bias, None if self.conv is None else self.conv.weight,
                self.out.weight, self.out.bias, attend=attend, heads=self.heads,
            )  # fmt: skip
        else:
            y = dense_module(self.out, self._attend(x, mask, attend))  # the q/k/v tensor is released before out() runs  # fmt: skip
        return first_order_only(self.dropout(y), type(self).__name__)

    def _attend(self, x: torch.Tensor, mask: torch.Tensor | None, attend: Attend) -> torch.Tensor:
        # A separate frame so that, under no_grad, the (b, n, 3·h·d) projection dies before the output
        # projection allocates: that is the module's peak-memory moment at long n.
        q, k, v = project_heads(
            x, self.qkv.weight, self.qkv.bias, self.heads, self.dim_head, key_bias_cancels=self.key_bias_cancels
        )  # (b, h, n, d) views
        return attend(q, k, v, mask, None if self.conv is None else self.conv.weight)

    def _attend_documents(
        self,
        documents: Documents,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        conv_weight: torch.Tensor | None,
    ) -> torch.Tensor:
        """:meth:`attend` on packed rows, heads (b, g, n, d) -> merged (b, n, g·d): every document as a
        sample of its own (``mask`` is in ``documents``, which was built from it)."""
        b, _, n, _ = q.shape
        parts = zip(documents.groups, *(split_documents(t, documents) for t in (q, k, v)))
        outs = [self.attend(qg, kg, vg, group.mask, conv_weight) for group, qg, kg, vg in parts]  # (G, L, g·d)
        return rows_from_documents(outs, documents, b, n)  # (b, n, g·d)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        conv_weight: torch.Tensor | None,
    ) -> torch.Tensor:
        """Heads ``q, k, v`` (b, g, n, d) -> merged outputs (b, n, g·d): the core plus the conv skip
        (``conv_weight`` (g, 1, K, 1)). g < h only when ``recompute`` runs by groups of heads."""
        o = self.core(q, k, v, mask)  # (b, g, n, d)
        if conv_weight is not None:
            if mask is not None:  # padding must not leak into real tokens through the conv
                v = v.masked_fill(padding(mask)[:, None, :, None], 0)
            o = add_conv_skip(o, v, conv_weight)  # (b, g, n, d): o + self.conv(v)
        return o.transpose(1, 2).flatten(2)  # (b, n, g*d); a view when core wrote a (b, n, g, d) buffer

    def extra_repr(self) -> str:
        extra = ", recompute=True" if self.recompute else ""
        return (
            f"dim={self.dim}, heads={self.heads}, dim_head={self.dim_head}, "
            f"conv_kernel_size={self.conv_kernel_size}{extra}"
        )
