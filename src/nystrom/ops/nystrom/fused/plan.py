"""What the fused kernels read from the mask: every token's landmark and every landmark's token range.

Legend: b batch, n tokens, m landmarks, L real tokens of a sample, r rank of a real token among them.

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

from nystrom.ops.plan import shared


class Plan(NamedTuple):
    """The mask's part of a fused call."""

    seg: torch.Tensor  # (b, n) int32: the token's landmark, m for padding
    bounds: torch.Tensor  # (b, m, 2) int32: [start, end) positions holding the landmark's tokens
    counts: torch.Tensor  # (b, m) int32: the landmark's real tokens (0: an empty landmark)


def _balanced(mask: torch.Tensor | None, b: int, n: int, m: int, device: torch.device) -> Plan:
    j = torch.arange(m + 1, dtype=torch.int32, device=device)  # (m + 1,)
    if mask is None:  # ranks are positions, L = n
        seg = torch.arange(n, dtype=torch.int32, device=device) * m // n  # (n,)
        starts = (j * n + (m - 1)) // m  # (m + 1,) r_j = ⌈j·n/m⌉, also its position
        bounds = torch.stack((starts[:-1], starts[1:]), -1)  # (m, 2)
        return Plan(seg.expand(b, n), bounds.expand(b, m, 2), (starts[1:] - starts[:-1]).expand(b, m))
    running = mask.cumsum(-1, dtype=torch.int32)  # (b, n) real tokens up to and including each position
    length = running[:, -1:].clamp(min=1)  # (b, 1) L; ≥ 1: unchecked rows (traced, GPU)
    seg = torch.where(mask, (running - 1) * m // length, m)  # (b, n)
    ranks = (j * length + (m - 1)) // m  # (b, m + 1) r_j
    starts = torch.searchsorted(running, ranks + 1, out_int32=True)  # (b, m + 1) the position of rank r_j
    bounds = torch.stack((starts[:, :-1], starts[:, 1:]), -1)  # (b, m, 2)
    return Plan(seg, bounds, ranks[:, 1:] - ranks[:, :-1])


def _front_padded(mask: torch.Tensor | None, b: int, n: int, m: int, device: torch.device) -> Plan:
    run = -(-n // m)  # l
    offset = m * run - n  # o
    edges = torch.arange(-offset, m * run - offset + 1, run, dtype=torch.int32, device=device).clamp_(0, n)
    bounds = torch.stack((edges[:-1], edges[1:]), -1).expand(b, m, 2)  # (b, m, 2)
    seg = (torch.arange(n, dtype=torch.int32, device=device) + offset) // run  # (n,)
    if mask is None:
        return Plan(seg.expand(b, n), bounds, (edges[1:] - edges[:-1]).expand(b, m))
    running = F.pad(mask.cumsum(-1, dtype=torch.int32), (1, 0))  # (b, n + 1), 0 before the first
    real = running[:, edges.long()]  # (b, m + 1) real tokens before each edge
    return Plan(torch.where(mask, seg, m), bounds, real[:, 1:] - real[:, :-1])


def _compute(mask: torch.Tensor | None, b: int, n: int, m: int, segments: str, device: torch.device) -> Plan:
    plan = (_balanced if segments == "balanced" else _front_padded)(mask, b, n, m, device)
    return Plan(*(t.contiguous() for t in plan))  # the kernels index rows: (b, ·) with real strides


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


def plan(mask: torch.Tensor | None, b: int, n: int, m: int, segments: str, device: torch.device) -> Plan:
    """The :class:`Plan` for ``mask`` (b, n): once per ``shared_plan`` block for that mask (a model's
    forward opens one: once for all layers); for no mask, once per shape for the process."""
    if mask is None and not torch.compiler.is_compiling():  # traced: the compiler folds it
        return _unmasked(b, n, m, segments, device)
    return shared(mask, ("fused", b, n, m, segments, device), lambda: _compute(mask, b, n, m, segments, device))
