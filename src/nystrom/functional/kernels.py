"""Memory-lean softmax attention against a *short* key set (the landmarks).

Legend: b batch, h heads, n queries, m keys (landmarks, small), d head dim, dv value dim, c chunk rows.

``short_key_attention(q, k, v) = softmax(q kᵀ · scale + bias) v`` with m ≪ n keys. Every softmax row
is complete inside a chunk of queries, so the forward streams the queries in chunks that fit in cache
and the backward recomputes each chunk's probabilities instead of saving them: no (n, m) matrix is ever
alive, forward or backward, and autograd saves only the inputs. Results are written straight into a
(b, n, h, dv) buffer so merging the heads afterwards is free.
"""

from __future__ import annotations

import torch

# Rows per chunk: c·m floats of scores stay in L2 for m ≤ 128; measured on 2 EPYC cores (2048–8192 flat).
CHUNK_ROWS = 4096


def _probs(
    qc: torch.Tensor, kt: torch.Tensor, bias: torch.Tensor | None, scale: float, buf: torch.Tensor
) -> torch.Tensor:
    """Softmax over the m keys of one chunk: qc (c, d), kt (d, m) -> (c, m), written into ``buf``."""
    s = torch.mm(qc, kt, out=buf[: qc.shape[0]])  # (c, m)
    if scale != 1.0:
        s.mul_(scale)
    if bias is not None:
        s.add_(bias)  # -inf on invalid landmarks
    s.sub_(s.amax(-1, keepdim=True)).exp_()
    return s.div_(s.sum(-1, keepdim=True))


class _ShortKeyAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, scale):
        b, h, n, d = q.shape
        dv = v.shape[-1]
        out = q.new_empty(b, n, h, dv)  # heads-interleaved so the caller's merge is a view
        kt = k.mT.contiguous()  # (b, h, d, m)
        vc = v.contiguous()
        buf = q.new_empty(min(CHUNK_ROWS, n), k.shape[2])
        for i in range(b):
            bi = None if bias is None else bias[i]
            for j in range(h):
                for s0 in range(0, n, CHUNK_ROWS):
                    s1 = min(s0 + CHUNK_ROWS, n)
                    p = _probs(q[i, j, s0:s1], kt[i, j], bi, scale, buf)  # (c, m)
                    torch.mm(p, vc[i, j], out=out[i, s0:s1, j])  # (c, dv)
        ctx.save_for_backward(q, k, v, bias)
        ctx.scale = scale
        return out.permute(0, 2, 1, 3)  # (b, h, n, dv) view

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, bias = ctx.saved_tensors
        scale = ctx.scale
        b, h, n, d = q.shape
        m = k.shape[2]
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dq = q.new_empty(b, n, h, d) if need_q else None
        dk = torch.zeros_like(k, memory_format=torch.contiguous_format) if need_k else None
        dvv = torch.zeros_like(v, memory_format=torch.contiguous_format) if need_v else None
        kt = k.mT.contiguous()
        kc, vc = k.contiguous(), v.contiguous()
        buf = q.new_empty(min(CHUNK_ROWS, n), m)
        dp = q.new_empty(min(CHUNK_ROWS, n), m)
        for i in range(b):
            bi = None if bias is None else bias[i]
            for j in range(h):
                for s0 in range(0, n, CHUNK_ROWS):
                    s1 = min(s0 + CHUNK_ROWS, n)
                    qc, go = q[i, j, s0:s1], grad_out[i, j, s0:s1]  # (c, d), (c, dv)
                    p = _probs(qc, kt[i, j], bi, scale, buf)  # (c, m) recomputed
                    if need_v:
                        dvv[i, j].addmm_(p.mT, go)  # (m, dv) += pᵀ dO
                    if not (need_q or need_k):
                        continue
                    ds = torch.mm(go, vc[i, j].mT, out=dp[: s1 - s0])  # (c, m) dP = dO vᵀ
                    ds.sub_((ds * p).sum(-1, keepdim=True)).mul_(p)  # dS = P ∘ (dP − rowsum(P ∘ dP))
                    if scale != 1.0:
                        ds.mul_(scale)
                    if need_q:
                        torch.mm(ds, kc[i, j], out=dq[i, s0:s1, j])  # (c, d)
                    if need_k:
                        dk[i, j].addmm_(ds.mT, qc)  # (m, d)
        dq = dq.permute(0, 2, 1, 3) if need_q else None
        return dq, dk, dvv, None, None


def short_key_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: torch.Tensor | None = None, scale: float
) -> torch.Tensor:
    """Chunked ``softmax(q kᵀ·scale + bias) v`` for few keys.

    Args:
        q: (b, h, n, d) queries (any strides; per-head rows must be unit-stride).
        k: (b, h, m, d) keys, m small.
        v: (b, h, m, dv) values.
        bias: optional (b, 1, m) additive score bias (0 or -inf), broadcast over heads and queries.
        scale: multiplier of the scores.

    Returns:
        (b, h, n, dv), a view of a contiguous (b, n, h, dv) buffer.
    """
    if q.stride(-1) != 1:
        q = q.contiguous()
    return _ShortKeyAttention.apply(q, k, v, bias, float(scale))
