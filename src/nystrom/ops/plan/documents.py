"""Packed documents: several documents end to end in a row, each attending only to itself.

Legend: b batch, n tokens per row, N = b·n tokens, D documents, L slots per document (the longest
document), h heads, d head dim, f features of a token row.

The canonical form is FlashAttention's ``cu_seqlens``: int32 or int64 (D + 1,), the offsets of the
documents in the N tokens read row after row, so document i is tokens [cu_seqlens[i], cu_seqlens[i + 1])
of the flattened batch. Every row starts a document (none runs from one row into the next). transformers'
per-token forms, ``seq_idx`` and position ids restarting at each document, become it in one place
(:func:`document_ids_from_positions`, then :func:`cu_seqlens_from_document_ids`).

How a packed call runs (:func:`run_packed`): the documents become a batch of their own, (D, L) with a
padding mask, and the very same attention runs on it. Padding is exact on every path (the CPU kernels,
the accelerator path, the traceable path and the fused kernels), so every document gets what it gets
alone, with its own landmarks by the same segment rule, and the fused op's launches per call do not
change. The cost: two row gathers, D·L instead of N token rows inside the attention (equal when the
documents are of one length), and what "its own landmarks" means for Nyström attention: one m×m kernel
and pseudo-inverse per document.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from nystrom.ops.plan.shared import adopt, shared
from nystrom.utils.checks import check_positive_int, value_checks_enabled


class Documents(NamedTuple):
    """Where every document's tokens are, as a (D, L) batch of its own."""

    index: torch.Tensor  # (D·L,) int64: the token (of the N) in each slot; a slot past its document's end repeats its first token
    slots: torch.Tensor  # (N,) int64: each token's slot
    mask: torch.Tensor  # (D, L) bool: real tokens (inside the document and real in the padding mask)
    length: int  # L


def check_cu_seqlens(
    cu_seqlens: torch.Tensor, b: int, n: int, device: torch.device, *, max_seqlen: int | None = None
) -> int:
    """Check ``cu_seqlens`` for b rows of n tokens; return L, the slots per document.

    L is ``max_seqlen`` when given (FlashAttention's bound on the longest document; checked where values
    are read, see :func:`~nystrom.utils.checks.value_checks_enabled`, and by a device-side assert on an
    accelerator), else the longest document: read on the host (free on the CPU, one synchronisation per
    forward on an accelerator, where models compute the plan once for all layers); under ``torch.compile``
    without ``max_seqlen``, the row length n (exact, at the cost of D·n token rows).
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(
            f"cu_seqlens must be an int32 tensor of document offsets, got {type(cu_seqlens).__name__}"
        )
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"cu_seqlens must be int32 (FlashAttention's layout) or int64, got {cu_seqlens.dtype}"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            "cu_seqlens must be 1-D (documents + 1,): 0, the end of each document, ..., batch × tokens; "
            f"got shape {tuple(cu_seqlens.shape)}"
        )
    if cu_seqlens.device.type != torch.device(device).type:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but the inputs are on {device}")
    if max_seqlen is not None:
        check_positive_int("max_seqlen", max_seqlen)
    if not value_checks_enabled(cu_seqlens):
        if max_seqlen is not None:
            return min(max_seqlen, n)
        if torch.compiler.is_compiling() or cu_seqlens.device.type == "meta":
            return n
        return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())  # one host read per plan
    offsets = cu_seqlens.tolist()
    total = b * n
    if offsets[0] != 0 or offsets[-1] != total:
        raise ValueError(
            f"cu_seqlens must run from 0 to batch × tokens = {b} × {n} = {total}, got {offsets[0]} … "
            f"{offsets[-1]}. Padding after the last document belongs to it (the mask hides it)"
        )
    lengths = [e - s for s, e in zip(offsets[:-1], offsets[1:])]
    for i, length in enumerate(lengths):
        if length <= 0:
            raise ValueError(
                f"cu_seqlens must increase strictly: document {i} is [{offsets[i]}, {offsets[i + 1]})"
            )
    starts = set(offsets)
    for r in range(1, b):
        if r * n not in starts:
            i = next(j for j, e in enumerate(offsets) if e > r * n) - 1
            raise ValueError(
                f"document {i} (tokens [{offsets[i]}, {offsets[i + 1]}) of the batch read row after row) "
                f"runs from row {r - 1} into row {r}: every row must start a document. Flatten the batch "
                "to one row (as DataCollatorWithFlattening does) or end the document with its row"
            )
    longest = max(lengths)
    if max_seqlen is not None and max_seqlen < longest:
        i = lengths.index(longest)
        raise ValueError(f"max_seqlen={max_seqlen} is shorter than document {i} ({longest} tokens)")
    return longest


def document_plan(
    cu_seqlens: torch.Tensor, mask: torch.Tensor | None, b: int, n: int, length: int, *, trusted: bool
) -> Documents:
    """The :class:`Documents` of checked ``cu_seqlens`` with L = ``length``; ``mask`` (b, n) bool or None.
    ``trusted``: ``length`` came from the values themselves (else a device-side assert guards it)."""
    device = cu_seqlens.device
    cu = cu_seqlens.long()
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]  # (D,), (D,)
    offset = torch.arange(length, device=device)  # (L,)
    inside = offset < lengths[:, None]  # (D, L)
    index = torch.where(inside, starts[:, None] + offset, starts[:, None])  # (D, L)
    real = inside if mask is None else inside & mask.reshape(-1)[index]  # (D, L)
    token = torch.arange(b * n, device=device)  # (N,)
    doc = torch.searchsorted(cu[1:], token, right=True)  # (N,) the document of each token
    within = token - starts[doc]  # (N,) position inside its document
    if not trusted and device.type not in ("cpu", "meta") and not torch.compiler.is_compiling():
        torch._assert_async((within < length).all(), "max_seqlen is shorter than a document of cu_seqlens")
    if mask is not None and value_checks_enabled(real):
        empty = (~real.any(-1)).nonzero().flatten().tolist()
        if empty:
            i = empty[0]
            raise ValueError(
                f"document {i} (tokens [{int(cu[i])}, {int(cu[i + 1])})) has no real token: the mask "
                "marks all of it as padding. Give padding to a document with real tokens (after its end)"
            )
    return Documents(index.reshape(-1), doc * length + within, real, length)


def packed_plan(
    cu_seqlens: torch.Tensor, mask: torch.Tensor | None, b: int, n: int, device: torch.device,
    *, max_seqlen: int | None = None,
) -> Documents:  # fmt: skip
    """Checked :class:`Documents`, once per :func:`~nystrom.ops.plan.shared.shared_plan` block that admits
    ``cu_seqlens`` and ``mask``; its mask is adopted by the block (what it determines is shared too)."""

    def compute() -> Documents:
        length = check_cu_seqlens(cu_seqlens, b, n, device, max_seqlen=max_seqlen)
        trusted = max_seqlen is None or value_checks_enabled(cu_seqlens)
        return document_plan(cu_seqlens, mask, b, n, length, trusted=trusted)

    plan = shared((cu_seqlens, mask), ("documents", b, n, max_seqlen), compute)
    adopt(plan.mask)
    return plan


def to_documents(x: torch.Tensor, plan: Documents) -> torch.Tensor:
    """(b, h, n, d) -> (D, h, L, d): one gather of the (N, h·d) token rows (a view for head views of a
    token-major projection), returned as head views of the (D, L, h, d) rows."""
    b, h, n, d = x.shape
    rows = x.transpose(1, 2).reshape(b * n, h * d)  # (N, h·d)
    return rows.index_select(0, plan.index).view(-1, plan.length, h, d).transpose(1, 2)  # (D, h, L, d)


def from_documents(y: torch.Tensor, plan: Documents, b: int, n: int) -> torch.Tensor:
    """(D, h, L, dv) -> (b, h, n, dv), every token's row from its slot (head views of (b, n, h, dv))."""
    _, h, _, dv = y.shape
    rows = y.transpose(1, 2).reshape(-1, h * dv)  # (D·L, h·dv)
    return rows.index_select(0, plan.slots).view(b, n, h, dv).transpose(1, 2)  # (b, h, n, dv)


def rows_from_documents(y: torch.Tensor, plan: Documents, b: int, n: int) -> torch.Tensor:
    """(D, L, f) -> (b, n, f): merged-head outputs back in their rows."""
    return y.reshape(-1, y.shape[-1]).index_select(0, plan.slots).view(b, n, -1)  # (b, n, f)


def run_packed(
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """``attend(q, k, v, mask)`` on every document as a sample of its own: q, k (b, h, n, d), v (b, h, n, dv)
    -> (b, h, n, dv), each document's rows exactly what ``attend`` gives it alone."""
    b, _, n, _ = q.shape
    plan = packed_plan(cu_seqlens, mask, b, n, q.device, max_seqlen=max_seqlen)
    out = attend(
        to_documents(q, plan), to_documents(k, plan), to_documents(v, plan), plan.mask
    )  # (D, h, L, dv)
    return from_documents(out, plan, b, n)


def document_ids_from_positions(position_ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(b, n) position ids restarting at every document (transformers' packing) -> (b, n) document ids.

    A real token starts a document where its position id is not the previous real token's + 1
    (transformers' rule, ``find_packed_sequence_indices``), and the first real token of a row does too.
    Padding (``mask`` False) never starts one: it stays with the document before it (the first one,
    before a row's first real token), which the mask hides, so a padded batch's position ids (repeated
    or arbitrary at padding) split nothing. Elementwise, no host read."""
    b, n = position_ids.shape
    real = torch.ones_like(position_ids, dtype=torch.bool) if mask is None else mask
    at = torch.arange(n, device=position_ids.device).expand(b, n)
    last_real = torch.where(real, at, -1).cummax(-1).values  # (b, n) the latest real token up to here
    prev = torch.cat((torch.full_like(last_real[:, :1], -1), last_real[:, :-1]), -1)  # (b, n) the one before
    prev_pos = position_ids.gather(-1, prev.clamp(min=0))  # (b, n)
    starts = real & ((prev < 0) | (position_ids != prev_pos + 1))  # (b, n)
    return (starts.long().cumsum(-1) - 1).clamp(min=0)  # (b, n)


def cu_seqlens_from_document_ids(document_ids: torch.Tensor) -> torch.Tensor:
    """(b, n) per-token document ids (transformers' ``seq_idx``; any ints that change exactly where a
    document starts) -> ``cu_seqlens`` int32 (D + 1,); every row starts a document. One host read (the
    number of documents is a shape): computed once per forward."""
    if not isinstance(document_ids, torch.Tensor) or document_ids.dim() != 2:
        shape = (
            tuple(document_ids.shape)
            if isinstance(document_ids, torch.Tensor)
            else type(document_ids).__name__
        )
        raise ValueError(f"document ids must have shape (batch, tokens), got {shape}")
    b, n = document_ids.shape
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    offsets = starts.reshape(-1).nonzero().flatten()  # (D,)
    end = torch.tensor([b * n], dtype=offsets.dtype, device=offsets.device)
    return torch.cat((offsets, end)).to(torch.int32)
