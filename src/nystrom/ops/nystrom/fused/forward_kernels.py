"""The fused forward's five Triton kernels (their host is :mod:`.forward`, which says what each computes).

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim; BH = b·h; S splits of the
tokens; BM, BD, BDV, BN tile sizes (powers of two ≥ 16: m, d, dv and a token block).

``PINV_DOT`` is the ``tl.dot`` input precision of the per-head kernels' float32 m×m products
(:data:`~nystrom.ops.nystrom.fused.launch.PINV_DOTS`); ``PRECISION``/``DOT`` those of the large products
(:func:`~nystrom.ops.nystrom.fused.launch.dot_options`).

This module imports Triton: :mod:`.forward` imports it on first use only, so ``TRITON_INTERPRET=1`` set
before then runs the kernels with Triton's CPU interpreter (the tests do).
"""

from __future__ import annotations

import triton
import triton.language as tl

from nystrom.ops.pinv.triton_steps import iterate


@triton.jit
def landmarks(q_ptr, k_ptr, seg_ptr, bounds_ptr, count_ptr, span_ptr, ql_ptr, kl_ptr,
              sqb, sqh, sqn, skb, skh, skn, H, n, m, d, scale,
              BN: tl.constexpr, BD: tl.constexpr):  # fmt: skip
    bh = tl.program_id(0).to(tl.int64)  # (sample, head)
    j = tl.program_id(1)
    sample, h = bh // H, bh % H
    b = tl.load(span_ptr + sample * 3).to(tl.int64)  # the sample's row
    start = tl.load(bounds_ptr + (sample * m + j) * 2)
    end = tl.load(bounds_ptr + (sample * m + j) * 2 + 1)
    inv = 1.0 / tl.maximum(tl.load(count_ptr + sample * m + j), 1).to(tl.float32)  # an empty landmark's sums are 0
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
                  BM: tl.constexpr, BD: tl.constexpr, PINV_DOT: tl.constexpr):  # fmt: skip
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
    scores = tl.dot(ql, tl.trans(kl), input_precision=PINV_DOT)  # (BM, BM), already scaled
    scores = tl.where(pair, scores, float("-inf"))
    peak = tl.where(valid, tl.max(scores, axis=1), 0.0)
    e = tl.exp(scores - peak[:, None])
    total = tl.where(valid, tl.sum(e, axis=1), 1.0)
    a = tl.where(pair, e / total[:, None], eye)  # an identity block on empty landmarks, 0 outside m
    inside = (rows[:, None] < m) & (rows[None, :] < m)
    mm = rows[:, None] * m + rows[None, :]
    tl.store(a_ptr + bh * m * m + mm, a, mask=inside)
    z = iterate(a, eye, it_ptr + bh * iterations * m * m + mm, inside, m * m, iterations, PINV_DOT)
    tl.store(z_ptr + bh * m * m + mm, z, mask=inside)


@triton.jit
def key_pass(ql_ptr, k_ptr, v_ptr, seg_ptr, span_ptr, acc_ptr, stat_ptr,
             skb, skh, skn, svb, svh, svn, H, n, m, d, dv, per_split, S,
             BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
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
    tile = (rows[:, None] < m) & (dcols[None, :] < d)
    ql = tl.load(ql_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=tile, other=0.0)
    ql = ql.to(k_ptr.dtype.element_ty)  # (BM, BD) in the inputs' dtype, as SDPA takes it
    peak = tl.full([BM], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    lo = first + split * per_split  # a split past a short sample's end reads nothing (partials −inf, 0)
    hi = tl.minimum(lo + per_split, last)
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
                BM: tl.constexpr, BDV: tl.constexpr, PINV_DOT: tl.constexpr):  # fmt: skip
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
    u = tl.dot(z, bv, input_precision=PINV_DOT)  # (BM, BDV) A⁺·(B·V)
    tl.store(u_ptr + bh * m * dv + rows[:, None] * dv + vcols[None, :], u.to(u_ptr.dtype.element_ty),
             mask=tile)  # fmt: skip


@triton.jit
def query_pass(q_ptr, kl_ptr, u_ptr, count_ptr, seg_ptr, span_ptr, v_ptr, w_ptr, o_ptr, lse_ptr,
               sqb, sqh, sqn, svb, svh, svn, sob, soh, son, H, n, L, m, d, dv, K, scale,
               BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
               CONV: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
    blocks = tl.cdiv(L, BN)  # one program per (sample, h, token block) on grid axis 0: no 65 535 limit
    pid = tl.program_id(0).to(tl.int64)
    bh = pid // blocks  # the blocks of one head are neighbours: k̃ and U stay in L2
    sample, h = bh // H, bh % H
    b = tl.load(span_ptr + sample * 3).to(tl.int64)  # the sample's row and its span [first, last) in it
    first = tl.load(span_ptr + sample * 3 + 1)
    last = tl.load(span_ptr + sample * 3 + 2)
    pos = first + (pid % blocks) * BN + tl.arange(0, BN)  # blocks past a short sample's end store nothing
    rows = tl.arange(0, BM)
    dcols = tl.arange(0, BD)
    vcols = tl.arange(0, BDV)
    inside = pos < last
    real = tl.load(seg_ptr + b * n + pos, mask=inside, other=m) < m
    q = tl.load(q_ptr + b * sqb + h * sqh + pos[:, None] * sqn + dcols[None, :],
                mask=real[:, None] & (dcols[None, :] < d), other=0.0)  # (BN, BD), padded rows 0  # fmt: skip
    klt = tl.load(kl_ptr + bh * m * d + rows[None, :] * d + dcols[:, None],
                  mask=(rows[None, :] < m) & (dcols[:, None] < d), other=0.0)  # (BD, BM)  # fmt: skip
    valid = tl.load(count_ptr + sample * m + rows, mask=rows < m, other=0) > 0
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
    if CONV:  # + Σ_t w[h, t] · v[pos + t − K//2]: the skip, padded rows and rows outside the sample read as 0
        for t in range(K):
            src = pos + t - K // 2
            ok = (src >= first) & (src < last)
            used = tl.load(seg_ptr + b * n + src, mask=ok, other=m) < m
            vs = tl.load(v_ptr + b * svb + h * svh + src[:, None] * svn + vcols[None, :],
                         mask=used[:, None] & (vcols[None, :] < dv), other=0.0)  # fmt: skip
            o += tl.load(w_ptr + h * K + t).to(tl.float32) * vs.to(tl.float32)
    tl.store(o_ptr + b * sob + h * soh + pos[:, None] * son + vcols[None, :], o.to(o_ptr.dtype.element_ty),
             mask=inside[:, None] & (vcols[None, :] < dv))  # fmt: skip
    has = total > 0  # a finite 0 where no landmark was attended (the backward's P_F is 0 there)
    tl.store(lse_ptr + (b * H + h) * n + pos, tl.where(has, safe + tl.log(tl.where(has, total, 1.0)), 0.0), mask=inside)
