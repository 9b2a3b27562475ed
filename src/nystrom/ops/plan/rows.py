"""Moving token rows between packed rows and the per-document batches of a :class:`Documents` plan.

Legend: b batch, n tokens per row, N = b·n tokens, G documents of a group, L slots per document of the
group, h heads, d head dim, dv value dim, f features of a token row.

A group of consecutive documents of one length is a slice of the N token rows; when every group is one, the
groups are the rows in order (:attr:`Documents.in_order`) and nothing is gathered either way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nystrom.ops.plan.documents import Documents, Group, packed_plan


def _token_rows(x: torch.Tensor) -> torch.Tensor:
    """(b, h, n, d) -> its (N, h·d) token rows (a view for head views of a token-major projection)."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b * n, h * d)


def to_documents(x: torch.Tensor, group: Group) -> torch.Tensor:
    """(b, h, n, d) -> (G, h, L, d): one gather of the (N, h·d) token rows (a view for head views of a
    token-major projection), returned as head views of the (G, L, h, d) rows."""
    h, d = x.shape[1], x.shape[3]
    rows = _token_rows(x)  # (N, h·d)
    if group.start is not None:  # consecutive documents of length L: a slice, no copy
        picked = rows.narrow(0, group.start, group.mask.shape[0] * group.length)  # (G·L, h·d)
    else:
        picked = rows.index_select(0, group.index)  # (G·L, h·d)
    return picked.view(-1, group.length, h, d).transpose(1, 2)  # (G, h, L, d)


def split_documents(x: torch.Tensor, plan: Documents) -> list[torch.Tensor]:
    """(b, h, n, d) -> every group's (G, h, L, d), as :func:`to_documents` gives each. When the groups are
    the rows' slices in order this is one split: its backward is one cat, where a slice per group would
    zero-fill all N rows of the gradient once per group (measured: 4.4 of 20 ms extra at 4K, 2 documents)."""
    if not plan.in_order:
        return [to_documents(x, g) for g in plan.groups]
    h, d = x.shape[1], x.shape[3]
    pieces = _token_rows(x).split([g.mask.shape[0] * g.length for g in plan.groups])  # (G·L, h·d) each, in order
    return [p.view(-1, g.length, h, d).transpose(1, 2) for p, g in zip(pieces, plan.groups)]  # (G, h, L, d)


def rows_from_documents(ys: list[torch.Tensor], plan: Documents, b: int, n: int) -> torch.Tensor:
    """Every group's (G, L, f) outputs -> (b, n, f): each token's row from its slot."""
    rows = [y.reshape(-1, y.shape[-1]) for y in ys]  # (G·L, f) each
    rows = rows[0] if len(rows) == 1 else torch.cat(rows)  # (Σ G·L, f)
    if plan.in_order:  # the groups' rows are the tokens in order
        return rows.view(b, n, -1)  # (b, n, f)
    return rows.index_select(0, plan.slots).view(b, n, -1)  # (b, n, f)


def from_documents(ys: list[torch.Tensor], plan: Documents, b: int, n: int) -> torch.Tensor:
    """Every group's (G, h, L, dv) outputs -> (b, h, n, dv) (head views of (b, n, h, dv))."""
    h, dv = ys[0].shape[1], ys[0].shape[3]
    merged = rows_from_documents([y.transpose(1, 2).flatten(2) for y in ys], plan, b, n)  # (b, n, h·dv)
    return merged.view(b, n, h, dv).transpose(1, 2)  # (b, h, n, dv)


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
    parts = zip(plan.groups, *(split_documents(t, plan) for t in (q, k, v)))
    outs = [attend(qg, kg, vg, g.mask) for g, qg, kg, vg in parts]  # (G, h, L, dv) each
    return from_documents(outs, plan, b, n)
