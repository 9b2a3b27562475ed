"""A drop-in for lucidrains' ``nystrom-attention`` (0.0.14) running on nystrom's core.

Legend: b batch, n tokens, h heads, d head dim (``dim_head``), m landmarks, e model dim (``dim``).

Change one import line::

    from nystrom_attention import NystromAttention, Nystromformer          # before
    from nystrom.compat.lucidrains import NystromAttention, Nystromformer  # after

Constructors, defaults, ``forward`` arguments and parameter names/shapes are lucidrains', so their
state dicts load with ``strict=True`` (and ours load into theirs). The maths is lucidrains' landmark
layout (n virtually padded at the front to a multiple of m, m runs of ⌈n/m⌉ positions, masked means),
computed by :func:`nystrom.functional.nystrom_attention` with ``segments="front_padded"``. Where
lucidrains is exact (n divisible by m, or a mask given and no landmark run empty) the outputs agree
(tested to 1e-4 with copied weights). Where it is not, ours stays exact:

- n not divisible by m and no mask: lucidrains' front padding enters the landmark means and the keys
  (zero keys with weight exp(0) in every softmax row). We exclude it, as lucidrains does with a mask.
- a landmark run with no real token (front padding ≥ ⌈n/m⌉ positions, e.g. n = 6000, m = 256; or long
  right padding): lucidrains gives the empty landmark a uniform row in A and its pseudo-inverse mixes
  it into the real ones. We drop empty landmarks exactly.
- ``pinv_init``: lucidrains scales Z₀ of the pseudo-inverse by one maximum over the whole batch and all
  heads, so a sample's output depends on its batch-mates. By default we do the same (``"original"``),
  because a lucidrains-trained checkpoint was trained with it; pass ``pinv_init="per_matrix"`` for
  batch-independent outputs. docs/lucidrains.md has the measured differences.

Packed documents (an extra of ours): ``forward(x, mask, cu_seqlens=..., max_seqlen=...)`` takes
FlashAttention's offsets (:func:`nystrom.functional.nystrom_attention`'s ``cu_seqlens``); every document
attends only to itself, with its own landmarks and conv skip, and gets exactly what it gets alone.
lucidrains' landmark runs depend on a sample's length and its Z₀ (``"original"``) on its batch-mates, so
the documents cannot share one batched call: each runs as a call of its own (the projections still run
once over all tokens), D calls for D documents.
"""

from __future__ import annotations

import torch
from torch import nn

from nystrom.layers.dropout import Dropout
from nystrom.layers.projection import project_heads
from nystrom.ops.conv import add_conv_skip
from nystrom.ops.nystrom import nystrom_attention, nystrom_factors
from nystrom.ops.pinv import PINV_INITS
from nystrom.ops.plan import check_cu_seqlens, is_packed
from nystrom.utils.checks import (
    check_choice,
    check_dtype_matches,
    check_mask,
    check_positive_int,
    first_order_only,
    rejects_key_padding_mask,
    value_checks_enabled,
)


class NystromAttention(nn.Module):
    """lucidrains' ``NystromAttention``: ``x (b, n, dim) -> (b, n, dim)`` (same arguments and defaults).

    Args:
        dim: model width e.
        dim_head, heads: d and h.
        num_landmarks: m (n need not divide by it).
        pinv_iterations: iterations of the Moore–Penrose approximation.
        residual: add the depthwise conv of V over the sequence (``res_conv``).
        residual_conv_kernel: its kernel length (odd).
        eps: kept for signature and state compatibility; our masked means divide by the exact count.
        dropout: dropout after the output projection.
        pinv_init: keyword-only extra: ``"original"`` (lucidrains' batch-wide Z₀, default, for parity) or
            ``"per_matrix"`` (batch-independent).

    Parameters: ``to_qkv`` Linear(e, 3·h·d, bias=False), ``to_out.0`` Linear(h·d, e),
    ``res_conv`` Conv2d(h, h, (K, 1), groups=h, bias=False).
    """

    def __init__(
        self,
        dim: int,
        dim_head: int = 64,
        heads: int = 8,
        num_landmarks: int = 256,
        pinv_iterations: int = 6,
        residual: bool = True,
        residual_conv_kernel: int = 33,
        eps: float = 1e-8,
        dropout: float = 0.0,
        *,
        pinv_init: str = "original",
    ) -> None:
        super().__init__()
        for name, val in (("dim", dim), ("dim_head", dim_head), ("heads", heads)):
            check_positive_int(name, val)
        self.eps = eps
        self.num_landmarks = check_positive_int("num_landmarks", num_landmarks)
        self.pinv_iterations = check_positive_int("pinv_iterations", pinv_iterations, minimum=0)
        self.pinv_init = check_choice("pinv_init", pinv_init, PINV_INITS)
        self.heads, self.dim_head = heads, dim_head
        self.scale = dim_head**-0.5
        inner = heads * dim_head
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), Dropout(dropout))
        self.residual = residual
        if residual:
            k = check_positive_int("residual_conv_kernel", residual_conv_kernel)
            if k % 2 == 0:
                raise ValueError(f"residual_conv_kernel must be odd, got {k}")
            self.res_conv = nn.Conv2d(heads, heads, (k, 1), padding=(k // 2, 0), groups=heads, bias=False)

    @rejects_key_padding_mask
    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_attn: bool = False,
        return_attn_matrices: bool = False,
        *,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...]]:
        """``x`` (b, n, dim), ``mask`` (b, n) bool with True = real token -> (b, n, dim).

        ``return_attn=True`` also returns the (b, h, n, n) Nyström attention matrix F·A⁺·B (lucidrains
        returns it at its padded length when m does not divide n); ``return_attn_matrices=True`` the
        factors (F (b, h, n, m), A⁺ (b, h, m, m), B (b, h, m, n)). Both are O(n²)/O(n·m) memory, in ≥ float32.

        ``cu_seqlens`` (documents + 1,) int32, ``max_seqlen``: packed documents (see the module docstring);
        every row starts a document. With them, ``return_attn``/``return_attn_matrices`` raise.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (batch, tokens, dim), got {shape}")
        check_dtype_matches(x, self.to_qkv.weight)
        b, n, _ = x.shape
        mask = check_mask(mask, b, n, x.device)
        packed = is_packed(cu_seqlens, max_seqlen)  # max_seqlen alone raises
        if packed and (return_attn or return_attn_matrices):
            raise ValueError(
                "return_attn/return_attn_matrices with packed documents (cu_seqlens) are not supported: a "
                "packed row has a matrix per document. Call the module on each document to inspect them"
            )
        if mask is not None:  # padded positions may hold NaN: zero them before any weight sees them
            x = x.masked_fill(~mask[..., None], 0)
        w, bias = self.to_qkv.weight, self.to_qkv.bias
        q, k, v = project_heads(x, w, bias, self.heads, self.dim_head)  # each (b, h, n, d) views
        opts = dict(
            num_landmarks=self.num_landmarks,
            mask=mask,
            pinv_iterations=self.pinv_iterations,
            pinv_init=self.pinv_init,
            segments="front_padded",
        )
        if not packed:
            o = self._attend(q, k, v, opts)  # (b, h, n, d)
        else:
            check_cu_seqlens(cu_seqlens, b, n, x.device, max_seqlen=max_seqlen)
            o = self._attend_documents(q, k, v, opts, cu_seqlens.tolist())  # (b, h, n, d)
        out = first_order_only(self.to_out(o.transpose(1, 2).flatten(2)), "NystromAttention")  # (b, n, e)
        if not (return_attn or return_attn_matrices):
            return out
        f, z, bmat = nystrom_factors(q, k, **opts)  # (b,h,n,m), (b,h,m,m), (b,h,m,n)
        if return_attn_matrices:
            return out, (f, z, bmat)
        return out, f @ z @ bmat  # (b, h, n, n)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: dict[str, object]
    ) -> torch.Tensor:
        """Attention plus the conv skip of one call: q, k, v (b, h, n, d) -> (b, h, n, d)."""
        o = nystrom_attention(q, k, v, **opts)  # (b, h, n, d)
        if self.residual:  # padded v is 0 already: x is, and to_qkv has no bias
            o = add_conv_skip(o, v, self.res_conv.weight)
        return o

    def _attend_documents(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: dict[str, object], offsets: list[int]
    ) -> torch.Tensor:
        """:meth:`_attend` on every packed document as a call of its own (see the module docstring): q, k, v
        (b, h, n, d) -> (b, h, n, d); document i is tokens [offsets[i], offsets[i + 1]) of the b·n."""
        b, h, n, _ = q.shape
        rows = [
            t.transpose(1, 2).reshape(1, b * n, h, -1).transpose(1, 2) for t in (q, k, v)
        ]  # (1, h, b·n, d)
        mask = opts["mask"]
        flat = None if mask is None else mask.reshape(1, b * n)  # (1, b·n)
        docs = []
        for i, (s, e) in enumerate(zip(offsets[:-1], offsets[1:])):
            doc_mask = None if flat is None else flat[:, s:e]  # (1, L)
            if doc_mask is not None and value_checks_enabled(doc_mask) and not bool(doc_mask.any()):
                raise ValueError(
                    f"document {i} (tokens [{s}, {e})) has no real token: the mask marks all of it as "
                    "padding. Give padding to a document with real tokens (after its end)"
                )
            docs.append(
                self._attend(*(t[:, :, s:e] for t in rows), {**opts, "mask": doc_mask})
            )  # (1, h, L, d)
        return torch.cat(docs, 2).transpose(1, 2).reshape(b, n, h, -1).transpose(1, 2)  # (b, h, n, d)


class PreNorm(nn.Module):
    """``fn(LayerNorm(x), ...)`` (lucidrains' ``PreNorm``; parameters ``norm``, ``fn``)."""

    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> torch.Tensor:
        """x (b, n, e) -> (b, n, e); ``mask`` and the packed documents' ``cu_seqlens``/``max_seqlen`` are
        passed on only when given (the feed-forward takes none)."""
        options = {"mask": mask, "cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen}
        return self.fn(self.norm(x), **{k: v for k, v in options.items() if v is not None})


class FeedForward(nn.Module):
    """Linear(e, e·mult) – GELU – Dropout – Linear(e·mult, e) (lucidrains' ``FeedForward``, ``net``)."""

    def __init__(self, dim: int, mult: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, dim * mult), nn.GELU(), Dropout(dropout), nn.Linear(dim * mult, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, n, e) -> (b, n, e)."""
        return self.net(x)


class Nystromformer(nn.Module):
    """lucidrains' ``Nystromformer``: ``depth`` pre-norm blocks of attention + feed-forward, residual sums.

    Takes embeddings ``x`` (b, n, dim) and an optional ``mask`` (b, n) bool (True = real token); returns
    (b, n, dim). Keyword-only arguments and defaults are lucidrains'; parameters live under
    ``layers.{i}.0`` (PreNorm of :class:`NystromAttention`) and ``layers.{i}.1`` (PreNorm of FeedForward).
    """

    def __init__(
        self,
        *,
        dim: int,
        depth: int,
        dim_head: int = 64,
        heads: int = 8,
        num_landmarks: int = 256,
        pinv_iterations: int = 6,
        attn_values_residual: bool = True,
        attn_values_residual_conv_kernel: int = 33,
        attn_dropout: float = 0.0,
        ff_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_positive_int("depth", depth)
        attn = dict(
            dim=dim,
            dim_head=dim_head,
            heads=heads,
            num_landmarks=num_landmarks,
            pinv_iterations=pinv_iterations,
            residual=attn_values_residual,
            residual_conv_kernel=attn_values_residual_conv_kernel,
            dropout=attn_dropout,
        )
        self.layers = nn.ModuleList(
            nn.ModuleList(
                [PreNorm(dim, NystromAttention(**attn)), PreNorm(dim, FeedForward(dim, dropout=ff_dropout))]
            )
            for _ in range(depth)
        )

    @rejects_key_padding_mask
    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> torch.Tensor:
        """x (b, n, dim), mask (b, n) bool or None -> (b, n, dim); ``cu_seqlens``/``max_seqlen``: packed
        documents (see the module docstring), each attending only to itself in every layer."""
        for attn, ff in self.layers:
            x = attn(x, mask=mask, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen) + x  # (b, n, e)
            x = ff(x) + x
        return x
