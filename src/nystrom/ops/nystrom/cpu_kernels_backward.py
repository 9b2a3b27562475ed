"""The recomputing backward passes of the two softmax kernels of :mod:`nystrom.ops.nystrom.cpu_kernels`.

Legend: b batch, h heads, n tokens, m landmarks (few), d head dim, dv value dim, c chunk length,
r row/key ranges per sample.

Neither backward reads a saved (n, m) or (m, n) matrix: the short-key one recomputes each chunk's
probabilities from q and the keys, the long-key one from the saved log-sum-exp. Work items are the
forwards' (sample, range of rows or keys), all heads batched, on the thread pool of ``utils/parallel.py``.

Why the tunables (chunk length, ranges per sample, the probability routine) are arguments: they are
read from ``cpu_kernels`` at call time, where tests and users set them (``cpu_kernels.CHUNK_ROWS = …``), so the
forward and its backward always chunk alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nystrom.utils.parallel import parallel_for, range_chunks

#: softmax(a @ b) of base-2 scores into ``out`` (h, c, m), keys masked by ``valid`` (m,): ``cpu_kernels._probs2``
Probs = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def short_key_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    kt: torch.Tensor,
    v: torch.Tensor,
    valid: torch.Tensor | None,
    *,
    scale: float,
    splits: int,
    chunk: int,
    probs: Probs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``softmax(q kᵀ·scale) v`` for q (b, h, n, d), k (b, h, m, d), v (b, h, m, dv).

    ``kt`` (b, h, d, m) are the forward's base-2 scaled keys; ``grad_out`` (b, h, n, dv). Returns dq
    (b, h, n, d) (a view of a (b, n, h, d) buffer), dk (b, h, m, d), dv (b, h, m, dv).
    """
    s = scale
    b, h, n, d = q.shape
    m = k.shape[2]
    ks = k * s  # (b, h, m, d) natural units: ∂(q·k s)/∂q
    span = -(-n // splits)
    dq = q.new_empty(b, n, h, d)  # no huge-page hint in backwards: see memory.py
    dk = q.new_zeros(b, splits, h, m, d)  # per row range, summed below
    dv = q.new_zeros(b, splits, h, m, v.shape[-1])

    # Row ranges with all heads batched, as in the forward: dq rows are disjoint per item.
    def item(t: int) -> None:
        i, r = divmod(t, splits)
        vi = None if valid is None else valid[i]
        buf = q.new_empty(h, min(chunk, span), m)
        for rows in range_chunks(r, span, n, chunk):
            qc, go = q[i, :, rows], grad_out[i, :, rows]  # (h, c, d), (h, c, dv)
            p = probs(qc, kt[i], buf[:, : rows.stop - rows.start], vi)  # (h, c, m) recomputed
            dv[i, r].baddbmm_(p.mT, go)  # (h, m, dv) += pᵀ dO
            ds = torch.bmm(go, v[i].mT)  # (h, c, m) dP = dO vᵀ
            ds.sub_((ds * p).sum(-1, keepdim=True)).mul_(p)  # dS = P ∘ (dP − rowsum(P ∘ dP))
            torch.bmm(ds, ks[i], out=dq[i, rows].transpose(0, 1))  # (h, c, d)
            dk[i, r].baddbmm_(ds.mT, qc, alpha=s)  # (h, m, d)

    parallel_for(item, range(b * splits), device=q.device)
    return dq.permute(0, 2, 1, 3), dk.sum(1), dv.sum(1)


def long_key_backward(
    grad_out: torch.Tensor,
    qs: torch.Tensor,
    qn: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    scale: float,
    splits: int,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``softmax(q kᵀ·scale) v`` for q (b, h, m, d), m few, k (b, h, n, d), v (b, h, n, dv).

    ``qs`` (b, h, m, d) are the base-2 queries the forward used, ``qn`` = q·scale in natural units,
    ``out`` (b, h, m, dv) and ``lse`` (b, h, m, 1) the forward's output and log2-sum-exp2; ``grad_out``
    (b, h, m, dv). Returns dq (b, h, m, d), dk (b, h, n, d), dv (b, h, n, dv) (dk, dv: (b, n, h, ·) views).
    """
    b, h, m, d = qs.shape
    n = k.shape[2]
    go = grad_out.contiguous()
    delta = (go * out).sum(-1, keepdim=True)  # (b, h, m, 1) = rowsum(P ∘ dP)
    span = -(-n // splits)
    dq = qs.new_zeros(b, splits, h, m, d)  # per key range, summed below
    dk = k.new_empty(b, n, h, d)  # no huge-page hint in backwards: see memory.py
    dv = v.new_empty(b, n, h, v.shape[-1])

    # Key ranges with all heads batched, as in the forward: dk/dv rows are disjoint per item. Every
    # row is written (padded keys get p = 0, so zero gradients).
    def item(t: int) -> None:
        i, r = divmod(t, splits)
        for keys in range_chunks(r, span, n, chunk):
            kc, vc = k[i, :, keys], v[i, :, keys]  # (h, c, d), (h, c, dv)
            p = torch.bmm(qs[i], kc.mT)  # (h, m, c)
            if key_mask is not None:
                p.masked_fill_(~key_mask[i, keys], float("-inf"))
            p.sub_(lse[i]).exp2_()  # recomputed probabilities
            torch.bmm(p.mT, go[i], out=dv[i, keys].transpose(0, 1))  # (h, c, dv)
            ds = torch.bmm(go[i], vc.mT)  # (h, m, c)
            ds.sub_(delta[i]).mul_(p)
            torch.bmm(ds.mT, qn[i], out=dk[i, keys].transpose(0, 1))  # (h, c, d)
            dq[i, r].baddbmm_(ds, kc)  # (h, m, d), scaled below

    parallel_for(item, range(b * splits), device=qs.device)
    return dq.sum(1).mul_(scale), dk.permute(0, 2, 1, 3), dv.permute(0, 2, 1, 3)
