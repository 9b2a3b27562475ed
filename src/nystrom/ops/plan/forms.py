"""transformers' forms of packed documents, made FlashAttention's ``cu_seqlens`` (the canonical form of
:mod:`nystrom.ops.plan.documents`) in one place, :func:`packed_cu_seqlens`, which our models and
``attn_implementation="nystrom"`` call: ``cu_seq_lens_q``/``cu_seq_lens_k`` with ``max_length_q``/
``max_length_k`` (``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``), ``seq_idx`` (each token's
document, ``return_seq_idx=True``) and position ids restarting at each document (the collator's default).

Legend: b batch, n tokens per row, N = b·n tokens, D documents.
"""

from __future__ import annotations

import torch

from nystrom.utils.checks import check_positive_int, value_checks_enabled


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


@torch.compiler.disable  # the number of documents is a shape read from the values: no graph can hold it
def _derived_cu_seqlens(document_ids: torch.Tensor) -> tuple[torch.Tensor | None, int | None]:
    """``(cu_seqlens, the longest document)`` of (b, n) document ids, ``(None, None)`` when every row is one
    document. Two host reads: the number of documents, and the longest, which spares every layer's plan
    a read of its own where no block shares it (``attn_implementation="nystrom"``)."""
    cu_seqlens = cu_seqlens_from_document_ids(document_ids)
    if cu_seqlens.numel() - 1 == document_ids.shape[0]:
        return None, None
    return cu_seqlens, int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def _one_of(name: str, q: object, k: object) -> object:
    """``q`` and ``k`` (a query and a key form, either may be None) as one: self-attention has one set of
    documents for queries and keys, so two given must be one object or equal (values read per
    :func:`~nystrom.utils.checks.value_checks_enabled`)."""
    if q is None or k is None or q is k:
        return k if q is None else q
    if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor):
        same = q.shape == k.shape and (not value_checks_enabled(q) or torch.equal(q, k.to(q)))
    else:
        same = q == k
    if not same:
        show = lambda t: t.tolist() if isinstance(t, torch.Tensor) else t  # noqa: E731
        raise ValueError(
            f"{name}_q={show(q)} and {name}_k={show(k)} differ: this is self-attention (every document "
            "attends to itself), so queries and keys have the same documents; give both the same value"
        )
    return q


def packed_cu_seqlens(
    b: int,
    n: int,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
) -> tuple[torch.Tensor | None, int | None]:
    """The packed documents of a self-attention call over b rows of n tokens, from transformers' keywords
    (``DataCollatorWithFlattening``'s), as ``(cu_seqlens, max_seqlen)``; ``(None, None)``: not packed.

    The first form given decides: ``cu_seq_lens_q``/``cu_seq_lens_k`` (FlashAttention's offsets, passed
    on as given, with ``max_length_q``/``max_length_k`` as ``max_seqlen``; the q and k forms must be one
    object or equal); ``seq_idx`` (b, n), each token's document; or ``position_ids`` (b, n) or (1, n)
    restarting at each document (:func:`document_ids_from_positions`, with ``attention_mask`` (b, n)
    bool, True = real token: padding never starts a document). The last two cost two host reads (the number
    of documents is a shape, and the longest document is ``max_seqlen``; under ``torch.compile``, a graph
    break) and give ``(None, None)`` when every row is one document, as the unpacked call is the same.
    Raises ``ValueError`` (``TypeError`` for a wrong type) on a malformed form."""
    max_seqlen = _one_of("max_length", max_length_q, max_length_k)
    if max_seqlen is not None:
        check_positive_int("max_length_q", max_seqlen)
    cu_seqlens = _one_of("cu_seq_lens", cu_seq_lens_q, cu_seq_lens_k)
    if cu_seqlens is not None:
        return cu_seqlens, max_seqlen  # type: ignore[return-value]  (checked by check_cu_seqlens)
    if max_seqlen is not None:
        raise ValueError(
            "max_length_q is the longest packed document's length: give it with cu_seq_lens_q (and "
            "cu_seq_lens_k), the documents' offsets"
        )
    for name, ids, rows in (("seq_idx", seq_idx, (b,)), ("position_ids", position_ids, (b, 1))):
        if ids is None:
            continue
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else None
        if shape is None or len(shape) != 2 or shape[1] != n or shape[0] not in rows:
            want = " or ".join(f"({r}, {n})" for r in dict.fromkeys(rows))
            raise ValueError(
                f"{name} must have shape (batch, tokens) = {want}, got {shape or type(ids).__name__}"
            )
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {ids.dtype}")
        if name == "position_ids":
            ids = document_ids_from_positions(ids.expand(b, n), attention_mask)  # (b, n)
        return _derived_cu_seqlens(ids)
    return None, None
