"""What the fused kernels read from the mask and the documents: every sample's token range, every token's
landmark and every landmark's token range.

Legend: b batch, n tokens, m landmarks, S samples (b rows, or D packed documents), L real tokens of a
sample, r rank of a real token among them, N = b·n tokens.

A sample is what gets its own m landmarks: a row, or with ``cu_seqlens`` a document of a packed row. The
kernels run one program set per (sample, head), bounded by the sample's span of its row, so a packed row
costs what its documents cost one by one (no padding to the longest) in the launches of one call.

The assignment is :func:`~nystrom.ops.nystrom.landmarks.landmark_assignment`'s, in closed form, with
fewer ops (on a GPU each is a launch; the plan is computed once per forward for all layers):

* ``"balanced"``: the real token of rank r goes to landmark ⌊r·m/L⌋, so landmark j holds the ranks
  [r_j, r_{j+1}) with r_j = ⌈j·L/m⌉: its count is r_{j+1} − r_j, and its tokens lie between the
  positions of ranks r_j and r_{j+1} (a ``searchsorted`` in the running count of real tokens);
* ``"front_padded"``: landmark j holds the positions [j·l − o, (j+1)·l − o) with l = ⌈n/m⌉ and
  o = m·l − n (the virtual front padding), its count the real tokens there.

Padded positions inside a range are skipped by the kernels through their landmark index ``m``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from nystrom.ops.plan import check_documents, shared, token_documents

#: (seg (b, n), bounds (b, m, 2), counts (b, m)) of every row: :class:`Plan`'s first three
Assignment = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Plan(NamedTuple):
    """The mask's and the documents' part of a fused call."""

    seg: torch.Tensor  # (b, n) int32: the token's landmark in its sample, m for padding
    bounds: torch.Tensor  # (S, m, 2) int32: [start, end) positions (in the row) holding the landmark's tokens
    counts: torch.Tensor  # (S, m) int32: the landmark's real tokens (0: an empty landmark)
    spans: torch.Tensor  # (S, 3) int32: the sample's row and its [start, end) positions in it
    length: int  # the longest span (n for rows): the token passes' grid


def _balanced(mask: torch.Tensor | None, b: int, n: int, m: int, device: torch.device) -> Assignment:
    j = torch.arange(m + 1, dtype=torch.int32, device=device)  # (m + 1,)
    if mask is None:  # ranks are positions, L = n
        seg = torch.arange(n, dtype=torch.int32, device=device) * m // n  # (n,)
        starts = (j * n + (m - 1)) // m  # (m + 1,) r_j = ⌈j·n/m⌉, also its position
        bounds = torch.stack((starts[:-1], starts[1:]), -1)  # (m, 2)
        return (seg.expand(b, n), bounds.expand(b, m, 2), (starts[1:] - starts[:-1]).expand(b, m))
    running = mask.cumsum(-1, dtype=torch.int32)  # (b, n) real tokens up to and including each position
    length = running[:, -1:].clamp(min=1)  # (b, 1) L; ≥ 1: unchecked rows (traced, GPU)
    seg = torch.where(mask, (running - 1) * m // length, m)  # (b, n)
    ranks = (j * length + (m - 1)) // m  # (b, m + 1) r_j
    starts = torch.searchsorted(running, ranks + 1, out_int32=True)  # (b, m + 1) the position of rank r_j
    bounds = torch.stack((starts[:, :-1], starts[:, 1:]), -1)  # (b, m, 2)
    return (seg, bounds, ranks[:, 1:] - ranks[:, :-1])


def _front_padded(mask: torch.Tensor | None, b: int, n: int, m: int, device: torch.device) -> Assignment:
    run = -(-n // m)  # l
    offset = m * run - n  # o
    edges = torch.arange(-offset, m * run - offset + 1, run, dtype=torch.int32, device=device).clamp_(0, n)
    bounds = torch.stack((edges[:-1], edges[1:]), -1).expand(b, m, 2)  # (b, m, 2)
    seg = (torch.arange(n, dtype=torch.int32, device=device) + offset) // run  # (n,)
    if mask is None:
        return (seg.expand(b, n), bounds, (edges[1:] - edges[:-1]).expand(b, m))
    running = F.pad(mask.cumsum(-1, dtype=torch.int32), (1, 0))  # (b, n + 1), 0 before the first
    real = running[:, edges.long()]  # (b, m + 1) real tokens before each edge
    return (torch.where(mask, seg, m), bounds, real[:, 1:] - real[:, :-1])


def _rows(b: int, n: int, device: torch.device) -> torch.Tensor:
    """(b, 3) int32: every row a sample, spanning [0, n)."""
    rows = torch.arange(b, dtype=torch.int32, device=device)  # (b,)
    return torch.stack((rows, torch.zeros_like(rows), torch.full_like(rows, n)), -1)


def _compute(mask: torch.Tensor | None, b: int, n: int, m: int, segments: str, device: torch.device) -> Plan:
    seg, bounds, counts = (_balanced if segments == "balanced" else _front_padded)(mask, b, n, m, device)
    # the kernels index rows: (b, ·) with real strides
    return Plan(seg.contiguous(), bounds.contiguous(), counts.contiguous(), _rows(b, n, device), n)


def _documents(
    cu_seqlens: torch.Tensor, mask: torch.Tensor | None, b: int, n: int, m: int, length: int, *, trusted: bool
) -> Plan:
    """The balanced rule of :func:`_balanced` per document of checked ``cu_seqlens`` (D + 1,): a
    document's real tokens are ranked from 0 and split among its own m landmarks."""
    device = cu_seqlens.device
    cu = cu_seqlens.long()
    starts, ends = cu[:-1], cu[1:]  # (D,)
    flat = torch.ones(b * n, dtype=torch.bool, device=device) if mask is None else mask.reshape(-1)  # (N,)
    doc, _ = token_documents(cu_seqlens, None if mask is None else flat, b * n, length, trusted=trusted)
    running = flat.cumsum(0)  # (N,) real tokens up to and including each token
    before = F.pad(running, (1, 0))  # (N + 1,) real tokens before each token
    base = before[starts]  # (D,) real tokens before each document
    real = (before[ends] - base).clamp(min=1)  # (D,) L; ≥ 1: unchecked documents (traced, GPU)
    seg = torch.where(flat, (running - 1 - base[doc]) * m // real[doc], m)  # (N,)
    j = torch.arange(m + 1, device=device)  # (m + 1,)
    ranks = (j * real[:, None] + (m - 1)) // m  # (D, m + 1) r_j
    # the position of rank r_j in the document, its end where no real token of it is left
    edges = torch.minimum(torch.searchsorted(running, base[:, None] + ranks + 1), ends[:, None])  # (D, m + 1)
    row = starts // n  # (D,) no document runs from one row into the next
    edges = edges - (row * n)[:, None]
    spans = torch.stack((row, starts - row * n, ends - row * n), -1)  # (D, 3)
    return Plan(
        seg.view(b, n).to(torch.int32), torch.stack((edges[:, :-1], edges[:, 1:]), -1).to(torch.int32).contiguous(),
        (ranks[:, 1:] - ranks[:, :-1]).to(torch.int32).contiguous(), spans.to(torch.int32).contiguous(), length,
    )  # fmt: skip


#: the plans of unmasked calls, a function of the shape alone: computed once per (b, n, m, segments,
#: device) and kept (on a GPU each of their ~9 ops is a launch, on every call otherwise), newest last
_UNMASKED: dict[tuple, Plan] = {}
_UNMASKED_KEPT = 32


def _unmasked(b: int, n: int, m: int, segments: str, device: torch.device) -> Plan:
    key = (b, n, m, segments, device)
    found = _UNMASKED.pop(key, None)
    if found is None:
        with torch.inference_mode(False):  # normal tensors: a later training call can save them
            found = _compute(None, b, n, m, segments, device)
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if capturing:  # computed inside a CUDA graph's capture: its values exist only in replays
            return found
        while len(_UNMASKED) >= _UNMASKED_KEPT:
            _UNMASKED.pop(next(iter(_UNMASKED)))
    _UNMASKED[key] = found  # most recently used last
    return found


def document_plan(
    cu_seqlens: torch.Tensor, mask: torch.Tensor | None, b: int, n: int, m: int, *, max_seqlen: int | None
) -> Plan:
    """The :class:`Plan` of packed documents (``cu_seqlens``, FlashAttention's layout, checked here) and
    ``mask`` (b, n) or None, balanced segments: once per ``shared_plan`` block that admits both."""

    def compute() -> Plan:
        length, lengths = check_documents(cu_seqlens, b, n, cu_seqlens.device, max_seqlen=max_seqlen)
        trusted = max_seqlen is None or lengths is not None
        return _documents(cu_seqlens, mask, b, n, m, length, trusted=trusted)

    return shared((cu_seqlens, mask), ("fused-documents", b, n, m, max_seqlen), compute)


def plan(mask: torch.Tensor | None, b: int, n: int, m: int, segments: str, device: torch.device) -> Plan:
    """The :class:`Plan` for ``mask`` (b, n), every row a sample: once per ``shared_plan`` block for that
    mask (a model's forward opens one: once for all layers); for no mask, once per shape for the process."""
    if mask is None and not torch.compiler.is_compiling():  # traced: the compiler folds it
        return _unmasked(b, n, m, segments, device)
    return shared(mask, ("fused", b, n, m, segments, device), lambda: _compute(mask, b, n, m, segments, device))
