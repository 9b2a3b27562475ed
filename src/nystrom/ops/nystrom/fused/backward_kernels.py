"""The fused backward's four Triton kernels (their host is :mod:`.backward`, which says what each computes).

Legend: as in :mod:`.forward_kernels`; dO the output's gradient.

This module imports Triton: :mod:`.backward` imports it on first use only (``TRITON_INTERPRET=1`` set
before then runs the kernels with Triton's CPU interpreter).
"""

from __future__ import annotations

import triton
import triton.language as tl

from nystrom.ops.pinv.triton_steps import initial_iterate_backward, reverse_step


@triton.jit
def query_backward(q_ptr, kl_ptr, u_ptr, count_ptr, seg_ptr, span_ptr, do_ptr, lse_ptr, dq_ptr, du_ptr, dkl_ptr,
                   sqb, sqh, sqn, sgb, sgh, sgn, H, n, m, d, dv, scale, per_split, S,
                   BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                   PRECISION: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
    bh = tl.program_id(0).to(tl.int64)  # (sample, head)
    split = tl.program_id(1)
    sample, h = bh // H, bh % H
    b = tl.load(span_ptr + sample * 3).to(tl.int64)  # the sample's row and its span [first, last) in it
    first = tl.load(span_ptr + sample * 3 + 1)
    last = tl.load(span_ptr + sample * 3 + 2)
    rows = tl.arange(0, BM)
    dcols = tl.arange(0, BD)
    vcols = tl.arange(0, BDV)
    dtile = (rows[:, None] < m) & (dcols[None, :] < d)
    kl = tl.load(kl_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=dtile, other=0.0)
    kl = kl.to(q_ptr.dtype.element_ty)  # (BM, BD), as the forward took it
    u = tl.load(u_ptr + bh * m * dv + rows[:, None] * dv + vcols[None, :],
                mask=(rows[:, None] < m) & (vcols[None, :] < dv), other=0.0)  # (BM, BDV)  # fmt: skip
    valid = tl.load(count_ptr + sample * m + rows, mask=rows < m, other=0) > 0
    du = tl.zeros([BM, BDV], dtype=tl.float32)
    dkl = tl.zeros([BM, BD], dtype=tl.float32)
    lo = first + split * per_split  # a split past a short sample's end adds nothing
    hi = tl.minimum(lo + per_split, last)
    for p0 in range(lo, hi, BN):
        pos = (p0 + tl.arange(0, BN)).to(tl.int64)  # pos · stride may pass 2³¹
        inside = pos < hi
        real = tl.load(seg_ptr + b * n + pos, mask=inside, other=m) < m
        q = tl.load(q_ptr + b * sqb + h * sqh + pos[:, None] * sqn + dcols[None, :],
                    mask=real[:, None] & (dcols[None, :] < d), other=0.0)  # (BN, BD)  # fmt: skip
        vmask = inside[:, None] & (vcols[None, :] < dv)
        do = tl.load(do_ptr + b * sgb + h * sgh + pos[:, None] * sgn + vcols[None, :], mask=vmask, other=0.0)
        lse = tl.load(lse_ptr + (b * H + h) * n + pos, mask=inside, other=0.0)
        s = tl.dot(q.to(DOT), tl.trans(kl).to(DOT), input_precision=PRECISION) * scale  # (BN, BM)
        p = tl.where(valid[None, :] & inside[:, None], tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do.to(DOT), tl.trans(u).to(DOT), input_precision=PRECISION)  # (BN, BM)
        delta = tl.sum(p * dp, axis=1)  # rowsum(dO∘O) of the attention part (O = P U): Σ P ∘ dO Uᵀ
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(kl.dtype).to(DOT), kl.to(DOT), input_precision=PRECISION) * scale  # (BN, BD)
        tl.store(dq_ptr + ((b * H + h) * n + pos[:, None]) * d + dcols[None, :], dq,
                 mask=inside[:, None] & (dcols[None, :] < d))  # fmt: skip
        du += tl.dot(tl.trans(p.to(do.dtype)).to(DOT), do.to(DOT), input_precision=PRECISION)
        dkl += tl.dot(tl.trans(ds.to(q.dtype)).to(DOT), q.to(DOT), input_precision=PRECISION) * scale
    part = bh * S + split
    tl.store(du_ptr + (part * BM + rows[:, None]) * BDV + vcols[None, :], du)
    tl.store(dkl_ptr + (part * BM + rows[:, None]) * BD + dcols[None, :], dkl)


@triton.jit
def landmark_backward(ql_ptr, kl_ptr, count_ptr, a_ptr, z_ptr, it_ptr, bv_ptr, du_ptr, dklp_ptr,
                      dbv_ptr, delta_ptr, dkl_ptr, dqlp_ptr, H, m, d, dv, iterations, S,
                      BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, PINV_DOT: tl.constexpr):  # fmt: skip
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    rows = tl.arange(0, BM)
    dcols = tl.arange(0, BD)
    vcols = tl.arange(0, BDV)
    du = tl.zeros([BM, BDV], dtype=tl.float32)
    dkl = tl.zeros([BM, BD], dtype=tl.float32)
    for split in range(S):
        part = bh * S + split
        du += tl.load(du_ptr + (part * BM + rows[:, None]) * BDV + vcols[None, :])
        dkl += tl.load(dklp_ptr + (part * BM + rows[:, None]) * BD + dcols[None, :])
    inside = (rows[:, None] < m) & (rows[None, :] < m)
    mm = rows[:, None] * m + rows[None, :]
    vtile = (rows[:, None] < m) & (vcols[None, :] < dv)
    z = tl.load(z_ptr + bh * m * m + mm, mask=inside, other=0.0)
    bv = tl.load(bv_ptr + bh * m * dv + rows[:, None] * dv + vcols[None, :], mask=vtile, other=0.0)
    dbv = tl.dot(tl.trans(z), du, input_precision=PINV_DOT)  # (BM, BDV) d(B·V) = A⁺ᵀ dU
    tl.store(dbv_ptr + (bh * BM + rows[:, None]) * BDV + vcols[None, :], dbv)
    tl.store(delta_ptr + bh * BM + rows, tl.sum(dbv * bv, axis=1))
    g = tl.dot(du, tl.trans(bv), input_precision=PINV_DOT)  # (BM, BM) dA⁺
    diag = (rows[:, None] == rows[None, :]) & (rows[:, None] < m)
    hk = 0.25 * g  # ¼ of the gradient of the current iterate
    da = tl.zeros([BM, BM], dtype=tl.float32)
    it_base = it_ptr + bh * iterations * m * m
    a_ptrs = a_ptr + bh * m * m + mm
    for step in range(iterations):
        zk = tl.load(it_base + (iterations - 1 - step) * m * m + mm, mask=inside, other=0.0)
        hk, da_step = reverse_step(a_ptrs, inside, zk, hk, diag, PINV_DOT)
        da += da_step
    a = tl.load(a_ptrs, mask=inside, other=0.0)
    da += initial_iterate_backward(a, 4.0 * hk, rows)  # 4·hk: the gradient of Z₀
    valid = tl.load(count_ptr + b * m + rows, mask=rows < m, other=0) > 0
    pair = valid[:, None] & valid[None, :]
    ds = tl.where(pair, a * (da - tl.sum(da * a, axis=1)[:, None]), 0.0)  # the softmax's backward
    dtile = (rows[:, None] < m) & (dcols[None, :] < d)
    ql = tl.load(ql_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=dtile, other=0.0)
    kl = tl.load(kl_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=dtile, other=0.0)
    dkl += tl.dot(tl.trans(ds), ql, input_precision=PINV_DOT)
    tl.store(dkl_ptr + (bh * BM + rows[:, None]) * BD + dcols[None, :], dkl)
    dql = tl.dot(ds, kl, input_precision=PINV_DOT)
    tl.store(dqlp_ptr + ((bh * (S + 1) + S) * BM + rows[:, None]) * BD + dcols[None, :], dql)


@triton.jit
def key_backward(ql_ptr, k_ptr, v_ptr, seg_ptr, count_ptr, span_ptr, lse_ptr, dbv_ptr, delta_ptr, dkl_ptr,
                 dk_ptr, dv_ptr, dqlp_ptr, do_ptr, w_ptr, dwp_ptr,
                 skb, skh, skn, svb, svh, svn, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, sgb, sgh, sgn,
                 H, n, m, d, dv, K, per_split, S,
                 BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BK: tl.constexpr,
                 CONV: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
    bh = tl.program_id(0).to(tl.int64)  # (sample, head)
    split = tl.program_id(1)
    sample, h = bh // H, bh % H
    b = tl.load(span_ptr + sample * 3).to(tl.int64)  # the sample's row and its span [first, last) in it
    first = tl.load(span_ptr + sample * 3 + 1)
    last = tl.load(span_ptr + sample * 3 + 2)
    rows = tl.arange(0, BM)
    dcols = tl.arange(0, BD)
    vcols = tl.arange(0, BDV)
    ql = tl.load(ql_ptr + bh * m * d + rows[:, None] * d + dcols[None, :],
                 mask=(rows[:, None] < m) & (dcols[None, :] < d), other=0.0)  # fmt: skip
    ql = ql.to(k_ptr.dtype.element_ty)  # (BM, BD), as the forward took it
    lse = tl.load(lse_ptr + bh * m + rows, mask=rows < m, other=0.0)
    dbv = tl.load(dbv_ptr + (bh * BM + rows[:, None]) * BDV + vcols[None, :]).to(ql.dtype)  # (BM, BDV)
    delta = tl.load(delta_ptr + bh * BM + rows)
    dql = tl.zeros([BM, BD], dtype=tl.float32)
    taps = tl.arange(0, BK)
    dw = tl.zeros([BK], dtype=tl.float32)
    lo = first + split * per_split  # a split past a short sample's end adds nothing
    hi = tl.minimum(lo + per_split, last)
    for p0 in range(lo, hi, BN):
        pos = (p0 + tl.arange(0, BN)).to(tl.int64)  # pos · stride may pass 2³¹
        inside = pos < hi
        seg = tl.load(seg_ptr + b * n + pos, mask=inside, other=m)
        real = seg < m
        kt = tl.load(k_ptr + b * skb + h * skh + pos[None, :] * skn + dcols[:, None],
                     mask=real[None, :] & (dcols[:, None] < d), other=0.0)  # (BD, BN)  # fmt: skip
        vb = tl.load(v_ptr + b * svb + h * svh + pos[:, None] * svn + vcols[None, :],
                     mask=real[:, None] & (vcols[None, :] < dv), other=0.0)  # (BN, BDV)  # fmt: skip
        s = tl.dot(ql.to(DOT), kt.to(DOT), input_precision=PRECISION)  # (BM, BN)
        p = tl.where(real[None, :] & (rows[:, None] < m), tl.exp(s - lse[:, None]), 0.0)
        dv_block = tl.dot(tl.trans(p.to(dbv.dtype)).to(DOT), dbv.to(DOT), input_precision=PRECISION)  # (BN, BDV)
        dp = tl.dot(dbv.to(DOT), tl.trans(vb).to(DOT), input_precision=PRECISION)  # (BM, BN)
        ds = p * (dp - delta[:, None])
        dk_block = tl.dot(tl.trans(ds.to(ql.dtype)).to(DOT), ql.to(DOT), input_precision=PRECISION)  # (BN, BD)
        own = tl.where(real, seg, 0)  # the token's landmark: k̃'s gradient, spread over its tokens
        w = 1.0 / tl.load(count_ptr + sample * m + own, mask=real, other=1).to(tl.float32)  # ≥ 1 at real tokens
        dk_block += w[:, None] * tl.load(dkl_ptr + (bh * BM + own[:, None]) * BD + dcols[None, :],
                                         mask=real[:, None], other=0.0)  # fmt: skip
        if CONV:  # the skip's transpose: v row j reached output rows j − t + K//2 (in its sample), weight w[h, t]
            for t in range(K):
                dst = pos - t + K // 2
                ok = (dst >= first) & (dst < last) & inside
                g = tl.load(do_ptr + b * sgb + h * sgh + dst[:, None] * sgn + vcols[None, :],
                            mask=ok[:, None] & (vcols[None, :] < dv), other=0.0).to(tl.float32)  # fmt: skip
                dv_block += tl.load(w_ptr + h * K + t).to(tl.float32) * g
                tap = tl.sum(tl.sum(g * vb.to(tl.float32), axis=1), axis=0)  # ∂w[h, t], this block's part
                dw += tl.where(taps == t, tap, 0.0)
        dk_block = tl.where(real[:, None], dk_block, 0.0)
        dv_block = tl.where(real[:, None], dv_block, 0.0)
        tl.store(dk_ptr + b * sdkb + h * sdkh + pos[:, None] * sdkn + dcols[None, :],
                 dk_block.to(dk_ptr.dtype.element_ty), mask=inside[:, None] & (dcols[None, :] < d))  # fmt: skip
        tl.store(dv_ptr + b * sdvb + h * sdvh + pos[:, None] * sdvn + vcols[None, :],
                 dv_block.to(dv_ptr.dtype.element_ty), mask=inside[:, None] & (vcols[None, :] < dv))  # fmt: skip
        dql += tl.dot(ds.to(kt.dtype).to(DOT), tl.trans(kt).to(DOT), input_precision=PRECISION)
    tl.store(dqlp_ptr + ((bh * (S + 1) + split) * BM + rows[:, None]) * BD + dcols[None, :], dql)
    if CONV:
        tl.store(dwp_ptr + (bh * S + split) * K + taps, dw, mask=taps < K)


@triton.jit
def query_landmarks(dq32_ptr, dql_ptr, seg_ptr, count_ptr, span_ptr, dq_ptr, sdqb, sdqh, sdqn, H, n, L, m, d,
                    scale, BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr):  # fmt: skip
    blocks = tl.cdiv(L, BN)  # one program per (sample, h, token block) on grid axis 0: no 65 535 limit
    pid = tl.program_id(0).to(tl.int64)
    bh = pid // blocks
    sample, h = bh // H, bh % H
    b = tl.load(span_ptr + sample * 3).to(tl.int64)  # the sample's row and its span [first, last) in it
    first = tl.load(span_ptr + sample * 3 + 1)
    last = tl.load(span_ptr + sample * 3 + 2)
    pos = first + (pid % blocks) * BN + tl.arange(0, BN)  # blocks past a short sample's end store nothing
    dcols = tl.arange(0, BD)
    inside = pos < last
    seg = tl.load(seg_ptr + b * n + pos, mask=inside, other=m)
    real = seg < m
    own = tl.where(real, seg, 0)
    tile = inside[:, None] & (dcols[None, :] < d)
    dq = tl.load(dq32_ptr + ((b * H + h) * n + pos[:, None]) * d + dcols[None, :], mask=tile, other=0.0)
    w = scale / tl.load(count_ptr + sample * m + own, mask=real, other=1).to(tl.float32)  # ≥ 1 at real tokens
    dq += w[:, None] * tl.load(dql_ptr + (bh * BM + own[:, None]) * BD + dcols[None, :],
                               mask=real[:, None], other=0.0)  # fmt: skip
    tl.store(dq_ptr + b * sdqb + h * sdqh + pos[:, None] * sdqn + dcols[None, :],
             tl.where(real[:, None], dq, 0.0).to(dq_ptr.dtype.element_ty), mask=tile)  # fmt: skip
