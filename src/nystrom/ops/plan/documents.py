"""Packed documents: several documents end to end in a row, each attending only to itself.

Legend: b batch, n tokens per row, N = b·n tokens, D documents, L slots per document (the longest
document), h heads, d head dim, f features of a token row.

The canonical form is FlashAttention's ``cu_seqlens``: int32 or int64 (D + 1,), the offsets of the
documents in the N tokens read row after row, so document i is tokens [cu_seqlens[i], cu_seqlens[i + 1])
of the flattened batch. Every row starts a document (none runs from one row into the next). transformers'
per-call forms (``cu_seq_lens_q``/``cu_seq_lens_k``, ``seq_idx``, position ids restarting at each document)
become it in one place, :mod:`nystrom.ops.plan.forms`.

How a packed call runs on the PyTorch paths (:func:`~nystrom.ops.plan.rows.run_packed`): the documents
become a batch of their own, (D, L) with a padding mask, and the very same attention runs on it. Padding is exact on every path
(the CPU kernels, the accelerator path, the traceable path), so every document gets what it gets alone,
with its own landmarks by the same segment rule. The cost: two row gathers, D·L instead of N token rows
inside the attention (equal when the documents are of one length), and what "its own landmarks" means for
Nyström attention: one m×m kernel and pseudo-inverse per document. On the CPU, where the lengths are on
the host anyway, documents of unlike lengths go in groups of like ones (:data:`GROUP_RATIO`,
:data:`GROUP_SLACK`), one padded batch each, so little padding is computed; elsewhere one batch. The fused
Triton kernels need none of this: they take every document as a sample in its own span of the row
(:func:`nystrom.ops.nystrom.fused.plan.document_plan`), with the launches of one unpacked call.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from nystrom.ops.plan.shared import adopt, shared
from nystrom.utils.checks import check_positive_int, value_checks_enabled

#: on the CPU a document joins the group of the longest ones left if it is at least this share of its
#: length, or at most :data:`GROUP_SLACK` tokens shorter; else it starts a group of its own
GROUP_RATIO = 0.8
GROUP_SLACK = 256


class Group(NamedTuple):
    """G documents as a batch of their own, padded to L slots (the longest of them)."""

    index: torch.Tensor  # (G·L,) int64: the token (of the N) in each slot; a slot past its document's end repeats its first token
    mask: torch.Tensor  # (G, L) bool: real tokens (inside the document and real in the padding mask)
    length: int  # L
    start: int | None = None  # where G documents of exactly L tokens follow each other: their first token


class Documents(NamedTuple):
    """Where every document's tokens are: its group's batch, and every token's slot in the groups' rows."""

    groups: tuple[Group, ...]
    slots: torch.Tensor  # (N,) int64: each token's row in the groups' (Σ G·L) output rows, in group order
    in_order: bool = (
        False  # the groups' rows, one after the other, are the N tokens in order (no gather back)
    )


def is_packed(cu_seqlens: torch.Tensor | None, max_seqlen: int | None) -> bool:
    """Whether a call packs documents; ``max_seqlen`` without ``cu_seqlens`` raises (it bounds them)."""
    if cu_seqlens is None and max_seqlen is not None:
        raise ValueError("max_seqlen is the longest packed document's length: give it with cu_seqlens")
    return cu_seqlens is not None


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
    return check_documents(cu_seqlens, b, n, device, max_seqlen=max_seqlen)[0]


def check_documents(
    cu_seqlens: torch.Tensor, b: int, n: int, device: torch.device, *, max_seqlen: int | None
) -> tuple[int, list[int] | None]:
    """:func:`check_cu_seqlens`'s L, and the documents' lengths where they were read (else None)."""
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
            return min(max_seqlen, n), None
        if torch.compiler.is_compiling() or cu_seqlens.device.type == "meta":
            return n, None
        return int((cu_seqlens[1:] - cu_seqlens[:-1]).max()), None  # one host read per plan
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
    return longest, lengths


def like_lengths(lengths: list[int]) -> list[list[int]]:
    """Documents (indices) in groups of like lengths, longest first (see :data:`GROUP_RATIO`)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        top = lengths[groups[-1][0]] if groups else 0
        if groups and (lengths[i] >= GROUP_RATIO * top or top - lengths[i] <= GROUP_SLACK):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _host_groups(lengths: list[int]) -> tuple[list[tuple[list[int], int, int | None]], bool]:
    """:func:`like_lengths`' groups as (documents, L, first token or None), and whether they are in order.
    A group of consecutive documents of one length is a slice of the tokens (no gather, no padding); when
    every group is one, they go in token order and the outputs need no gather back either."""
    starts = [0, *itertools.accumulate(lengths)]
    groups = []
    for docs in like_lengths(lengths):  # ascending within a group (a stable sort of equal lengths)
        size = lengths[docs[0]]
        run = docs == list(range(docs[0], docs[0] + len(docs))) and all(lengths[i] == size for i in docs)
        groups.append((docs, size, starts[docs[0]] if run else None))
    in_order = all(first is not None for _, _, first in groups)
    return (sorted(groups, key=lambda g: g[0][0]) if in_order else groups), in_order


def document_plan(
    cu_seqlens: torch.Tensor,
    mask: torch.Tensor | None,
    b: int,
    n: int,
    length: int,
    *,
    trusted: bool,
    groups: list[tuple[list[int], int, int | None]] | None = None,
    in_order: bool = False,
) -> Documents:
    """The :class:`Documents` of checked ``cu_seqlens``; ``mask`` (b, n) bool or None. ``groups``: the
    documents (indices) of each group, its L and its first token where its documents are consecutive and
    of length L (:attr:`Group.start`), or None: all of them in one group of L = ``length``; ``in_order``:
    the groups' rows are the tokens in order (:attr:`Documents.in_order`).
    ``trusted``: ``length`` came from the values themselves (else a device-side assert guards it)."""
    device = cu_seqlens.device
    cu = cu_seqlens.long()
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]  # (D,), (D,)
    flat = None if mask is None else mask.reshape(-1)  # (N,)
    parts, base = [], 0
    slot_start = torch.empty_like(starts)  # (D,) each document's first row in the groups' output rows
    for docs, size, first in [(None, length, None)] if groups is None else groups:
        pick = slice(None) if docs is None else torch.tensor(docs, device=device)
        s, ls = starts[pick], lengths[pick]  # (G,)
        offset = torch.arange(size, device=device)  # (L,)
        inside = offset < ls[:, None]  # (G, L)
        index = torch.where(inside, s[:, None] + offset, s[:, None])  # (G, L)
        real = inside if flat is None else inside & flat[index]  # (G, L)
        slot_start[pick] = base + torch.arange(s.shape[0], device=device) * size
        base += s.shape[0] * size
        parts.append(Group(index.reshape(-1), real, size, first))
    doc, within = token_documents(cu_seqlens, flat, b * n, length, trusted=trusted)
    return Documents(tuple(parts), slot_start[doc] + within, in_order)


def token_documents(
    cu_seqlens: torch.Tensor, mask: torch.Tensor | None, tokens: int, length: int, *, trusted: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's document and its position inside it, (N,) int64 each, for checked ``cu_seqlens`` of
    N = ``tokens`` and ``mask`` (N,) bool or None. A document the mask leaves without a real token raises where values are
    read; ``length`` (the slots per document) not ``trusted``: a device-side assert on an accelerator."""
    cu = cu_seqlens.long()
    starts = cu[:-1]  # (D,)
    token = torch.arange(tokens, device=cu.device)  # (N,)
    doc = torch.searchsorted(cu[1:], token, right=True)  # (N,) the document of each token
    within = token - starts[doc]  # (N,) position inside its document
    device = cu.device
    if not trusted and device.type not in ("cpu", "meta") and not torch.compiler.is_compiling():
        torch._assert_async((within < length).all(), "max_seqlen is shorter than a document of cu_seqlens")
    if mask is not None and value_checks_enabled(mask):
        real_tokens = torch.zeros_like(starts).index_add_(0, doc, mask.long())  # (D,)
        empty = (real_tokens == 0).nonzero().flatten().tolist()
        if empty:
            i = empty[0]
            raise ValueError(
                f"document {i} (tokens [{int(cu[i])}, {int(cu[i + 1])})) has no real token: the mask "
                "marks all of it as padding. Give padding to a document with real tokens (after its end)"
            )
    return doc, within


def packed_plan(
    cu_seqlens: torch.Tensor, mask: torch.Tensor | None, b: int, n: int, device: torch.device,
    *, max_seqlen: int | None = None,
) -> Documents:  # fmt: skip
    """Checked :class:`Documents`, once per :func:`~nystrom.ops.plan.shared.shared_plan` block that admits
    ``cu_seqlens`` and ``mask``; its mask is adopted by the block (what it determines is shared too)."""

    def compute() -> Documents:
        length, lengths = check_documents(cu_seqlens, b, n, device, max_seqlen=max_seqlen)
        trusted = max_seqlen is None or lengths is not None
        groups, in_order = None, False
        if lengths is not None and cu_seqlens.device.type == "cpu":  # on the host already: group like lengths
            groups, in_order = _host_groups(lengths)
        return document_plan(
            cu_seqlens, mask, b, n, length, trusted=trusted, groups=groups, in_order=in_order
        )

    plan = shared((cu_seqlens, mask), ("documents", b, n, max_seqlen), compute)
    for group in plan.groups:
        adopt(group.mask)
    return plan
