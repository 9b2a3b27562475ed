"""The fused forward: Nyström attention in five Triton kernels.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim, s score scale; BH = b·h programs
rows; S splits of the tokens; BM, BD, BDV, BN tile sizes (powers of two ≥ 16: m, d, dv and a token block).

1. ``landmarks``: q̃·s and k̃ (BH, m, d) float32, one program per (head, landmark), reading only the
   landmark's token range and skipping padded positions (a padded value, even NaN, is never loaded).
2. ``landmark_pinv``: A = softmax(q̃ k̃ᵀ) (an identity block on empty landmarks) and A⁺ by the iterative
   method, one program per head: A, the iterates Z_0 … Z_{K-1} and Z_K stay in on-chip memory.
3. ``key_pass``: the m landmark queries against a split of the n keys with an online softmax
   (flash-decoding): per split, the unnormalised B·V, its row maxima and row sums.
4. ``key_combine``: merges the splits into B·V and its log-sum-exp, and multiplies U = A⁺·(B·V).
5. ``query_pass``: out = softmax(q k̃ᵀ s)·U for a block of queries (plus, with a conv weight, the
   depthwise conv skip of v over K neighbouring rows, padded rows read as 0), and the rows' log-sum-exp.

Precision follows the PyTorch accelerator path: landmarks, A, A⁺ and B·V in float32 (products in IEEE
float32: TF32 would spoil the pinv polynomial); the two large products take q̃, k̃ and U in the inputs'
dtype with float32 accumulation, as SDPA does. Padded queries read as zeros, so their rows are finite
(the same function as the PyTorch path, whose padded inputs are zeroed).

Triton is imported and the kernels built on first use, so ``TRITON_INTERPRET=1`` set before then runs
them with Triton's CPU interpreter (the tests do).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from nystrom.ops.nystrom.fused.launch import (
    TOKEN_BLOCK,
    block,
    dot_options,
    launch,
    scratch,
    splits,
    token_block,
    warps,
)


class Forward(NamedTuple):
    """The output and what the backward reads (no n×m matrix: it recomputes those)."""

    out: torch.Tensor  # (b, h, n, dv), a head view of (b, n, h, dv) memory
    q_l: torch.Tensor  # (BH, m, d) float32, q̃ times the scale
    k_l: torch.Tensor  # (BH, m, d) float32
    a: torch.Tensor  # (BH, m, m) float32
    iterates: torch.Tensor  # (BH, K, m, m) float32
    z: torch.Tensor  # (BH, m, m) float32 A⁺
    bv: torch.Tensor  # (BH, m, dv) float32 B·V
    lse_b: torch.Tensor  # (BH, m) float32 log-sum-exp of B's rows
    u: torch.Tensor  # (BH, m, dv) in the inputs' dtype, A⁺·(B·V)
    lse_f: torch.Tensor  # (BH, n) float32 log-sum-exp of F's rows


@functools.cache
def kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def landmarks(q_ptr, k_ptr, seg_ptr, bounds_ptr, count_ptr, ql_ptr, kl_ptr,
                  sqb, sqh, sqn, skb, skh, skn, H, n, m, d, scale,
                  BN: tl.constexpr, BD: tl.constexpr):  # fmt: skip
        bh = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)
        b, h = bh // H, bh % H
        start = tl.load(bounds_ptr + (b * m + j) * 2)
        end = tl.load(bounds_ptr + (b * m + j) * 2 + 1)
        inv = 1.0 / tl.maximum(tl.load(count_ptr + b * m + j), 1).to(tl.float32)  # an empty landmark's sums are 0
        cols = tl.arange(0, BD)
        acc_q = tl.zeros([BD], dtype=tl.float32)
        acc_k = tl.zeros([BD], dtype=tl.float32)
        for p0 in range(start, end, BN):
            pos = (p0 + tl.arange(0, BN)).to(tl.int64)  # pos · stride may pass 2³¹
            seg = tl.load(seg_ptr + b * n + pos, mask=pos < end, other=-1)
            take = (seg == j)[:, None] & (cols[None, :] < d)  # (BN, BD): padding inside the range skipped
            x = tl.load(q_ptr + b * sqb + h * sqh + pos[:, None] * sqn + cols[None, :], mask=take, other=0.0)
            acc_q += tl.sum(x.to(tl.float32), axis=0)
            x = tl.load(k_ptr + b * skb + h * skh + pos[:, None] * skn + cols[None, :], mask=take, other=0.0)
            acc_k += tl.sum(x.to(tl.float32), axis=0)
        out = (bh * m + j) * d + cols
        tl.store(ql_ptr + out, acc_q * (inv * scale), mask=cols < d)
        tl.store(kl_ptr + out, acc_k * inv, mask=cols < d)

    @triton.jit
    def landmark_pinv(ql_ptr, kl_ptr, count_ptr, a_ptr, z_ptr, it_ptr, H, m, d, iterations,
                      BM: tl.constexpr, BD: tl.constexpr):  # fmt: skip
        bh = tl.program_id(0).to(tl.int64)
        b = bh // H
        rows = tl.arange(0, BM)
        dcols = tl.arange(0, BD)
        tile = (rows[:, None] < m) & (dcols[None, :] < d)
        ql = tl.load(ql_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=tile, other=0.0)
        kl = tl.load(kl_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=tile, other=0.0)
        valid = tl.load(count_ptr + b * m + rows, mask=rows < m, other=0) > 0  # (BM,)
        pair = valid[:, None] & valid[None, :]  # (BM, BM)
        eye = tl.where((rows[:, None] == rows[None, :]) & (rows[:, None] < m), 1.0, 0.0)
        scores = tl.dot(ql, tl.trans(kl), input_precision="ieee")  # (BM, BM), already scaled
        scores = tl.where(pair, scores, float("-inf"))
        peak = tl.where(valid, tl.max(scores, axis=1), 0.0)
        e = tl.exp(scores - peak[:, None])
        total = tl.where(valid, tl.sum(e, axis=1), 1.0)
        a = tl.where(pair, e / total[:, None], eye)  # an identity block on empty landmarks, 0 outside m
        inside = (rows[:, None] < m) & (rows[None, :] < m)
        mm = rows[:, None] * m + rows[None, :]
        tl.store(a_ptr + bh * m * m + mm, a, mask=inside)
        absa = tl.abs(a)
        norm_1 = tl.max(tl.sum(absa, axis=0), axis=0)  # max column sum
        norm_inf = tl.max(tl.sum(absa, axis=1), axis=0)  # max row sum
        z = tl.trans(a) / (norm_1 * norm_inf)
        it_base = it_ptr + bh * iterations * m * m
        for k in range(iterations):
            tl.store(it_base + k * m * m + mm, z, mask=inside)  # Z_k, for the backward
            az = tl.dot(a, z, input_precision="ieee")
            t = 7.0 * eye - az
            t = 15.0 * eye - tl.dot(az, t, input_precision="ieee")
            t = 13.0 * eye - tl.dot(az, t, input_precision="ieee")
            z = tl.dot(0.25 * z, t, input_precision="ieee")
        tl.store(z_ptr + bh * m * m + mm, z, mask=inside)

    @triton.jit
    def key_pass(ql_ptr, k_ptr, v_ptr, seg_ptr, acc_ptr, stat_ptr,
                 skb, skh, skn, svb, svh, svn, H, n, m, d, dv, per_split, S,
                 BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                 PRECISION: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
        bh = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        b, h = bh // H, bh % H
        rows = tl.arange(0, BM)
        dcols = tl.arange(0, BD)
        vcols = tl.arange(0, BDV)
        tile = (rows[:, None] < m) & (dcols[None, :] < d)
        ql = tl.load(ql_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=tile, other=0.0)
        ql = ql.to(k_ptr.dtype.element_ty)  # (BM, BD) in the inputs' dtype, as SDPA takes it
        peak = tl.full([BM], float("-inf"), dtype=tl.float32)
        total = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BDV], dtype=tl.float32)
        lo = split * per_split
        hi = tl.minimum(lo + per_split, n)
        for p0 in range(lo, hi, BN):
            pos = (p0 + tl.arange(0, BN)).to(tl.int64)  # pos · stride may pass 2³¹
            real = tl.load(seg_ptr + b * n + pos, mask=pos < hi, other=m) < m  # (BN,)
            kt = tl.load(k_ptr + b * skb + h * skh + pos[None, :] * skn + dcols[:, None],
                         mask=real[None, :] & (dcols[:, None] < d), other=0.0)  # (BD, BN)  # fmt: skip
            s = tl.dot(ql.to(DOT), kt.to(DOT), input_precision=PRECISION)  # (BM, BN)
            s = tl.where(real[None, :], s, float("-inf"))
            new_peak = tl.maximum(peak, tl.max(s, axis=1))
            safe = tl.where(new_peak == float("-inf"), 0.0, new_peak)  # no real key yet: nothing to scale
            p = tl.exp(s - safe[:, None])
            alpha = tl.exp(peak - safe)
            total = total * alpha + tl.sum(p, axis=1)
            vb = tl.load(v_ptr + b * svb + h * svh + pos[:, None] * svn + vcols[None, :],
                         mask=real[:, None] & (vcols[None, :] < dv), other=0.0)  # (BN, BDV)  # fmt: skip
            acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype).to(DOT), vb.to(DOT), input_precision=PRECISION)
            peak = new_peak
        part = bh * S + split
        tl.store(acc_ptr + (part * BM + rows[:, None]) * BDV + vcols[None, :], acc)
        tl.store(stat_ptr + part * 2 * BM + rows, peak)
        tl.store(stat_ptr + part * 2 * BM + BM + rows, total)

    @triton.jit
    def key_combine(acc_ptr, stat_ptr, z_ptr, bv_ptr, lse_ptr, u_ptr, m, dv, S,
                    BM: tl.constexpr, BDV: tl.constexpr):  # fmt: skip
        bh = tl.program_id(0).to(tl.int64)
        rows = tl.arange(0, BM)
        vcols = tl.arange(0, BDV)
        peak = tl.full([BM], float("-inf"), dtype=tl.float32)
        total = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BDV], dtype=tl.float32)
        for split in range(S):
            part = bh * S + split
            part_acc = tl.load(acc_ptr + (part * BM + rows[:, None]) * BDV + vcols[None, :])
            part_peak = tl.load(stat_ptr + part * 2 * BM + rows)
            part_total = tl.load(stat_ptr + part * 2 * BM + BM + rows)
            new_peak = tl.maximum(peak, part_peak)
            safe = tl.where(new_peak == float("-inf"), 0.0, new_peak)
            mine, theirs = tl.exp(peak - safe), tl.exp(part_peak - safe)
            acc = acc * mine[:, None] + part_acc * theirs[:, None]
            total = total * mine + part_total * theirs
            peak = new_peak
        bv = acc / tl.where(total > 0, total, 1.0)[:, None]  # (BM, BDV) B·V
        tile = (rows[:, None] < m) & (vcols[None, :] < dv)
        tl.store(bv_ptr + bh * m * dv + rows[:, None] * dv + vcols[None, :], bv, mask=tile)
        has = total > 0  # no real key in the sample: a finite 0 (no key reads it), not −inf
        tl.store(lse_ptr + bh * m + rows, tl.where(has, peak + tl.log(tl.where(has, total, 1.0)), 0.0), mask=rows < m)
        inside = (rows[:, None] < m) & (rows[None, :] < m)
        z = tl.load(z_ptr + bh * m * m + rows[:, None] * m + rows[None, :], mask=inside, other=0.0)
        u = tl.dot(z, bv, input_precision="ieee")  # (BM, BDV) A⁺·(B·V)
        tl.store(u_ptr + bh * m * dv + rows[:, None] * dv + vcols[None, :], u.to(u_ptr.dtype.element_ty),
                 mask=tile)  # fmt: skip

    @triton.jit
    def query_pass(q_ptr, kl_ptr, u_ptr, count_ptr, seg_ptr, v_ptr, w_ptr, o_ptr, lse_ptr,
                   sqb, sqh, sqn, svb, svh, svn, sob, soh, son, H, n, m, d, dv, K, scale,
                   BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                   CONV: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
        blocks = tl.cdiv(n, BN)  # one program per (b, h, token block) on grid axis 0: no 65 535 limit
        pid = tl.program_id(0).to(tl.int64)
        bh = pid // blocks  # the blocks of one head are neighbours: k̃ and U stay in L2
        b, h = bh // H, bh % H
        pos = (pid % blocks) * BN + tl.arange(0, BN)
        rows = tl.arange(0, BM)
        dcols = tl.arange(0, BD)
        vcols = tl.arange(0, BDV)
        inside = pos < n
        real = tl.load(seg_ptr + b * n + pos, mask=inside, other=m) < m
        q = tl.load(q_ptr + b * sqb + h * sqh + pos[:, None] * sqn + dcols[None, :],
                    mask=real[:, None] & (dcols[None, :] < d), other=0.0)  # (BN, BD), padded rows 0  # fmt: skip
        klt = tl.load(kl_ptr + bh * m * d + rows[None, :] * d + dcols[:, None],
                      mask=(rows[None, :] < m) & (dcols[:, None] < d), other=0.0)  # (BD, BM)  # fmt: skip
        valid = tl.load(count_ptr + b * m + rows, mask=rows < m, other=0) > 0
        s = tl.dot(q.to(DOT), klt.to(q.dtype).to(DOT), input_precision=PRECISION) * scale  # (BN, BM)
        s = tl.where(valid[None, :], s, float("-inf"))
        peak = tl.max(s, axis=1)  # −inf in a sample with no real token (front_padded: no landmark holds one)
        safe = tl.where(peak == float("-inf"), 0.0, peak)
        p = tl.exp(s - safe[:, None])  # all 0 in such a sample
        total = tl.sum(p, axis=1)
        u = tl.load(u_ptr + bh * m * dv + rows[:, None] * dv + vcols[None, :],
                    mask=(rows[:, None] < m) & (vcols[None, :] < dv), other=0.0)  # (BM, BDV)  # fmt: skip
        o = tl.dot(p.to(u.dtype).to(DOT), u.to(DOT), input_precision=PRECISION)
        o = o / tl.where(total > 0, total, 1.0)[:, None]  # a row with no landmark: 0, not 0/0
        if CONV:  # + Σ_t w[h, t] · v[pos + t − K//2]: the skip, padded and outside rows read as 0
            for t in range(K):
                src = pos + t - K // 2
                ok = (src >= 0) & (src < n)
                used = tl.load(seg_ptr + b * n + src, mask=ok, other=m) < m
                vs = tl.load(v_ptr + b * svb + h * svh + src[:, None] * svn + vcols[None, :],
                             mask=used[:, None] & (vcols[None, :] < dv), other=0.0)  # fmt: skip
                o += tl.load(w_ptr + h * K + t).to(tl.float32) * vs.to(tl.float32)
        tl.store(o_ptr + b * sob + h * soh + pos[:, None] * son + vcols[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=inside[:, None] & (vcols[None, :] < dv))  # fmt: skip
        has = total > 0  # a finite 0 where no landmark was attended (the backward's P_F is 0 there)
        tl.store(lse_ptr + bh * n + pos, tl.where(has, safe + tl.log(tl.where(has, total, 1.0)), 0.0), mask=inside)

    return landmarks, landmark_pinv, key_pass, key_combine, query_pass


def outputs(q: torch.Tensor, v: torch.Tensor, m: int, iterations: int) -> Forward:
    """The forward's output tensors, allocated (also the op's fake kernel)."""
    b, h, n, d = q.shape
    dv, bh = v.shape[-1], b * h
    f32 = dict(dtype=torch.float32, device=q.device)
    return Forward(
        q.new_empty(b, n, h, dv).transpose(1, 2),  # (b, h, n, dv): the heads merge as a view
        torch.empty(bh, m, d, **f32), torch.empty(bh, m, d, **f32), torch.empty(bh, m, m, **f32),
        torch.empty(bh, iterations, m, m, **f32), torch.empty(bh, m, m, **f32), torch.empty(bh, m, dv, **f32),
        torch.empty(bh, m, **f32), torch.empty(bh, m, dv, dtype=q.dtype, device=q.device), torch.empty(bh, n, **f32),
    )  # fmt: skip


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg: torch.Tensor,
    bounds: torch.Tensor,
    counts: torch.Tensor,
    conv_weight: torch.Tensor | None,
    scale: float,
    iterations: int,
) -> Forward:
    """The five launches on q, k (b, h, n, d) and v (b, h, n, dv) with unit stride in the last dim;
    ``conv_weight`` (h, K) or None: the conv skip of v, added in the query pass (read as float32)."""
    b, h, n, d = q.shape
    dv, m, bh = v.shape[-1], counts.shape[-1], b * h
    landmarks, landmark_pinv, key_pass, key_combine, query_pass = kernels()
    bm, bd, bdv, bn = block(m), block(d), block(dv), TOKEN_BLOCK
    bk, bq = token_block("key_pass"), token_block("query_pass")  # the passes' token blocks (tunable)
    res = outputs(q, v, m, iterations)
    launch(landmarks, (bh, m), q, k, seg, bounds, counts, res.q_l, res.k_l,
           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           h, n, m, d, scale, BN=bn, BD=bd)  # fmt: skip
    launch(landmark_pinv, (bh,), res.q_l, res.k_l, counts, res.a, res.z, res.iterates, h, m, d, iterations,
           BM=bm, BD=bd, num_warps=warps("landmark_pinv", bm))  # fmt: skip
    per_split, s = splits(n, bh, bk, q.device)
    acc, stat = scratch(q.device, (bh, s, bm, bdv), (bh, s, 2, bm))  # the splits' partial B·V and stats
    dots = dot_options(q.dtype)
    launch(key_pass, (bh, s), res.q_l, k, v, seg, acc, stat,
           k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
           h, n, m, d, dv, per_split, s, BM=bm, BN=bk, BD=bd, BDV=bdv, **dots,
           num_warps=warps("key_pass", bm, q.dtype))  # fmt: skip
    launch(key_combine, (bh,), acc, stat, res.z, res.bv, res.lse_b, res.u, m, dv, s, BM=bm, BDV=bdv,
           num_warps=warps("key_combine", bm))  # fmt: skip
    conv = conv_weight is not None
    out = res.out
    launch(query_pass, (bh * -(-n // bq),), q, res.k_l, res.u, counts, seg, v,
           conv_weight if conv else counts, out, res.lse_f,
           q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2),
           out.stride(0), out.stride(1), out.stride(2), h, n, m, d, dv, conv_weight.shape[-1] if conv else 1, scale,
           BN=bq, BM=bm, BD=bd, BDV=bdv, CONV=conv, **dots, num_warps=warps("query_pass", bm, q.dtype))  # fmt: skip
    return res
