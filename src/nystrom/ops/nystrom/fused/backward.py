"""The fused backward: the forward's passes in reverse, in four Triton kernels and one sum (two with the
conv skip).

Legend: as in :mod:`.forward`; O the output, dO its gradient, P_F = softmax(q k̃ᵀ s) (n, m) and
P_B = softmax(q̃ Kᵀ) (m, n), recomputed block by block from the saved log-sum-exps (FlashAttention-2's
rule: nothing of size n×m is stored).

1. ``query_backward`` (splits of n): dP_F = dO Uᵀ, D_F = rowsum(P_F∘dP_F) (= rowsum(dO∘O) of the
   attention part, so the output, which holds the conv skip too, is not read), dS_F = P_F∘(dP_F − D_F);
   dq ← s·dS_F k̃ (float32, the landmark term comes in step 4); per split dU = P_Fᵀ dO and dk̃ = s·dS_Fᵀ q.
2. ``landmark_backward`` (one program per head): sums the splits; d(B·V) = A⁺ᵀ dU, dA⁺ = dU (B·V)ᵀ;
   the pseudo-inverse's reverse sweep (:mod:`nystrom.ops.pinv.op` has the formulas) and Z₀'s norms
   give dA; dS_A = A∘(dA − rowsum(dA∘A)) on the used landmarks; dq̃ += dS_A k̃, dk̃ += dS_Aᵀ q̃.
3. ``key_backward`` (splits of n): D_B = rowsum(d(B·V)∘(B·V)), dS_B = P_B∘(d(B·V) Vᵀ − D_B);
   dv = P_Bᵀ d(B·V), dk = dS_Bᵀ q̃ + (the landmark term) w·dk̃; per split dq̃ = dS_B K. With the conv
   skip: dv += Σ_t w[t]·dO[j − t + K//2], and per split the weight's gradient Σ_j v_j·dO[j − t + K//2]
   (summed over splits and samples by a second ATen sum).
4. the splits' dq̃ summed (one ATen sum), then ``query_landmarks``: dq = dq + s·w·dq̃ of the token's
   landmark (w = 1/its real tokens); padded positions get 0, as the PyTorch path's zeroing gives.
"""

from __future__ import annotations

import functools

import torch

from nystrom.ops.nystrom.fused.forward import Forward
from nystrom.ops.nystrom.fused.launch import block, dot_options, launch, scratch, splits, token_block, warps


@functools.cache
def kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def query_backward(q_ptr, kl_ptr, u_ptr, count_ptr, seg_ptr, do_ptr, lse_ptr, dq_ptr, du_ptr, dkl_ptr,
                       sqb, sqh, sqn, sgb, sgh, sgn, H, n, m, d, dv, scale, per_split, S,
                       BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                       PRECISION: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
        bh = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        b, h = bh // H, bh % H
        rows = tl.arange(0, BM)
        dcols = tl.arange(0, BD)
        vcols = tl.arange(0, BDV)
        dtile = (rows[:, None] < m) & (dcols[None, :] < d)
        kl = tl.load(kl_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=dtile, other=0.0)
        kl = kl.to(q_ptr.dtype.element_ty)  # (BM, BD), as the forward took it
        u = tl.load(u_ptr + bh * m * dv + rows[:, None] * dv + vcols[None, :],
                    mask=(rows[:, None] < m) & (vcols[None, :] < dv), other=0.0)  # (BM, BDV)  # fmt: skip
        valid = tl.load(count_ptr + b * m + rows, mask=rows < m, other=0) > 0
        du = tl.zeros([BM, BDV], dtype=tl.float32)
        dkl = tl.zeros([BM, BD], dtype=tl.float32)
        lo = split * per_split
        hi = tl.minimum(lo + per_split, n)
        for p0 in range(lo, hi, BN):
            pos = (p0 + tl.arange(0, BN)).to(tl.int64)  # pos · stride may pass 2³¹
            inside = pos < hi
            real = tl.load(seg_ptr + b * n + pos, mask=inside, other=m) < m
            q = tl.load(q_ptr + b * sqb + h * sqh + pos[:, None] * sqn + dcols[None, :],
                        mask=real[:, None] & (dcols[None, :] < d), other=0.0)  # (BN, BD)  # fmt: skip
            vmask = inside[:, None] & (vcols[None, :] < dv)
            do = tl.load(do_ptr + b * sgb + h * sgh + pos[:, None] * sgn + vcols[None, :], mask=vmask, other=0.0)
            lse = tl.load(lse_ptr + bh * n + pos, mask=inside, other=0.0)
            s = tl.dot(q.to(DOT), tl.trans(kl).to(DOT), input_precision=PRECISION) * scale  # (BN, BM)
            p = tl.where(valid[None, :] & inside[:, None], tl.exp(s - lse[:, None]), 0.0)
            dp = tl.dot(do.to(DOT), tl.trans(u).to(DOT), input_precision=PRECISION)  # (BN, BM)
            delta = tl.sum(p * dp, axis=1)  # rowsum(dO∘O) of the attention part (O = P U): Σ P ∘ dO Uᵀ
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(kl.dtype).to(DOT), kl.to(DOT), input_precision=PRECISION) * scale  # (BN, BD)
            tl.store(dq_ptr + (bh * n + pos[:, None]) * d + dcols[None, :], dq,
                     mask=inside[:, None] & (dcols[None, :] < d))  # fmt: skip
            du += tl.dot(tl.trans(p.to(do.dtype)).to(DOT), do.to(DOT), input_precision=PRECISION)
            dkl += tl.dot(tl.trans(ds.to(q.dtype)).to(DOT), q.to(DOT), input_precision=PRECISION) * scale
        part = bh * S + split
        tl.store(du_ptr + (part * BM + rows[:, None]) * BDV + vcols[None, :], du)
        tl.store(dkl_ptr + (part * BM + rows[:, None]) * BD + dcols[None, :], dkl)

    @triton.jit
    def landmark_backward(ql_ptr, kl_ptr, count_ptr, a_ptr, z_ptr, it_ptr, bv_ptr, du_ptr, dklp_ptr,
                          dbv_ptr, delta_ptr, dkl_ptr, dqlp_ptr, H, m, d, dv, iterations, S,
                          BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):  # fmt: skip
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
        dbv = tl.dot(tl.trans(z), du, input_precision="ieee")  # (BM, BDV) d(B·V) = A⁺ᵀ dU
        tl.store(dbv_ptr + (bh * BM + rows[:, None]) * BDV + vcols[None, :], dbv)
        tl.store(delta_ptr + bh * BM + rows, tl.sum(dbv * bv, axis=1))
        g = tl.dot(du, tl.trans(bv), input_precision="ieee")  # (BM, BM) dA⁺
        diag = (rows[:, None] == rows[None, :]) & (rows[:, None] < m)
        hk = 0.25 * g  # ¼ of the gradient of the current iterate
        da = tl.zeros([BM, BM], dtype=tl.float32)
        it_base = it_ptr + bh * iterations * m * m
        for step in range(iterations):  # ordered so that each m×m tile dies early (registers)
            zk = tl.load(it_base + (iterations - 1 - step) * m * m + mm, mask=inside, other=0.0)
            a = tl.load(a_ptr + bh * m * m + mm, mask=inside, other=0.0)  # re-read (L1/L2), not kept live
            y = tl.dot(a, zk, input_precision="ieee")
            pk = tl.where(diag, 7.0 - y, -y)  # 7I − Y
            qk = tl.where(diag, 15.0, 0.0) - tl.dot(y, pk, input_precision="ieee")
            rk = tl.where(diag, 13.0, 0.0) - tl.dot(y, qk, input_precision="ieee")
            dr = tl.dot(tl.trans(zk), hk, input_precision="ieee")  # ∂R
            hk = tl.dot(hk, tl.trans(rk), input_precision="ieee")  # G Rᵀ, the first half of ¼ ∂Z_k
            dq = tl.dot(tl.trans(y), dr, input_precision="ieee")  # −∂Q
            dy = -tl.dot(dr, tl.trans(qk), input_precision="ieee")
            dy += tl.dot(dq, tl.trans(pk), input_precision="ieee")
            dy -= tl.dot(tl.trans(y), dq, input_precision="ieee")  # ∂Y = −∂P − ∂R Qᵀ − ∂Q Pᵀ, ∂P = Yᵀ(−∂Q)
            da += tl.dot(dy, tl.trans(zk), input_precision="ieee")
            a = tl.load(a_ptr + bh * m * m + mm, mask=inside, other=0.0)
            hk = 0.25 * (hk + tl.dot(tl.trans(a), dy, input_precision="ieee"))
        a = tl.load(a_ptr + bh * m * m + mm, mask=inside, other=0.0)
        g0 = 4.0 * hk  # the gradient of Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞)
        absa = tl.abs(a)
        col_sums = tl.sum(absa, axis=0)
        row_sums = tl.sum(absa, axis=1)
        norm_1 = tl.max(col_sums, axis=0)
        norm_inf = tl.max(row_sums, axis=0)
        c = 1.0 / (norm_1 * norm_inf)
        inner = tl.sum(tl.sum(g0 * tl.trans(a), axis=1), axis=0) * c  # ⟨G₀, Z₀⟩
        sign = tl.where(a > 0, 1.0, tl.where(a < 0, -1.0, 0.0))
        col_max = rows[None, :] == tl.argmax(col_sums, axis=0)
        row_max = rows[:, None] == tl.argmax(row_sums, axis=0)
        da += c * tl.trans(g0)
        da -= tl.where(col_max, inner / norm_1 * sign, 0.0) + tl.where(row_max, inner / norm_inf * sign, 0.0)
        valid = tl.load(count_ptr + b * m + rows, mask=rows < m, other=0) > 0
        pair = valid[:, None] & valid[None, :]
        ds = tl.where(pair, a * (da - tl.sum(da * a, axis=1)[:, None]), 0.0)  # the softmax's backward
        dtile = (rows[:, None] < m) & (dcols[None, :] < d)
        ql = tl.load(ql_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=dtile, other=0.0)
        kl = tl.load(kl_ptr + bh * m * d + rows[:, None] * d + dcols[None, :], mask=dtile, other=0.0)
        dkl += tl.dot(tl.trans(ds), ql, input_precision="ieee")
        tl.store(dkl_ptr + (bh * BM + rows[:, None]) * BD + dcols[None, :], dkl)
        dql = tl.dot(ds, kl, input_precision="ieee")
        tl.store(dqlp_ptr + ((bh * (S + 1) + S) * BM + rows[:, None]) * BD + dcols[None, :], dql)

    @triton.jit
    def key_backward(ql_ptr, k_ptr, v_ptr, seg_ptr, count_ptr, lse_ptr, dbv_ptr, delta_ptr, dkl_ptr,
                     dk_ptr, dv_ptr, dqlp_ptr, do_ptr, w_ptr, dwp_ptr,
                     skb, skh, skn, svb, svh, svn, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, sgb, sgh, sgn,
                     H, n, m, d, dv, K, per_split, S,
                     BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BK: tl.constexpr,
                     CONV: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
        bh = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        b, h = bh // H, bh % H
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
        lo = split * per_split
        hi = tl.minimum(lo + per_split, n)
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
            w = 1.0 / tl.load(count_ptr + b * m + own, mask=real, other=1).to(tl.float32)  # ≥ 1 at real tokens
            dk_block += w[:, None] * tl.load(dkl_ptr + (bh * BM + own[:, None]) * BD + dcols[None, :],
                                             mask=real[:, None], other=0.0)  # fmt: skip
            if CONV:  # the skip's transpose: v row j reached output rows j − t + K//2 with weight w[h, t]
                for t in range(K):
                    dst = pos - t + K // 2
                    ok = (dst >= 0) & (dst < n) & inside
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
    def query_landmarks(dq32_ptr, dql_ptr, seg_ptr, count_ptr, dq_ptr, sdqb, sdqh, sdqn, H, n, m, d, scale,
                        BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr):  # fmt: skip
        blocks = tl.cdiv(n, BN)  # one program per (b, h, token block) on grid axis 0: no 65 535 limit
        pid = tl.program_id(0).to(tl.int64)
        bh = pid // blocks
        b, h = bh // H, bh % H
        pos = (pid % blocks) * BN + tl.arange(0, BN)
        dcols = tl.arange(0, BD)
        inside = pos < n
        seg = tl.load(seg_ptr + b * n + pos, mask=inside, other=m)
        real = seg < m
        own = tl.where(real, seg, 0)
        tile = inside[:, None] & (dcols[None, :] < d)
        dq = tl.load(dq32_ptr + (bh * n + pos[:, None]) * d + dcols[None, :], mask=tile, other=0.0)
        w = scale / tl.load(count_ptr + b * m + own, mask=real, other=1).to(tl.float32)  # ≥ 1 at real tokens
        dq += w[:, None] * tl.load(dql_ptr + (bh * BM + own[:, None]) * BD + dcols[None, :],
                                   mask=real[:, None], other=0.0)  # fmt: skip
        tl.store(dq_ptr + b * sdqb + h * sdqh + pos[:, None] * sdqn + dcols[None, :],
                 tl.where(real[:, None], dq, 0.0).to(dq_ptr.dtype.element_ty), mask=tile)  # fmt: skip

    return query_backward, landmark_backward, key_backward, query_landmarks


def backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg: torch.Tensor,
    counts: torch.Tensor,
    conv_weight: torch.Tensor | None,
    saved: Forward,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk (b, h, n, d), dv (b, h, n, dv) and the conv weight's gradient (h, K) (empty without one)
    for the gradient ``grad`` of the output: four launches and one sum (two with the conv)."""
    b, h, n, d = q.shape
    dv, m, bh = v.shape[-1], counts.shape[-1], b * h
    iterations = saved.iterates.shape[1]
    query_backward, landmark_backward, key_backward, query_landmarks = kernels()
    bm, bd, bdv = block(m), block(d), block(dv)
    bn = token_block("query_backward")  # key_backward and query_landmarks share it (and the splits)
    dots = dot_options(q.dtype)
    per_split, s = splits(n, bh, bn, q.device)
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()  # e.g. a sum's expanded ones: stride 0
    conv = conv_weight is not None
    taps = conv_weight.shape[-1] if conv else 1
    dq32, du, dkl_parts, dbv, delta, dkl, dql_parts, dw_parts = scratch(
        q.device, (bh, n, d), (bh, s, bm, bdv), (bh, s, bm, bd), (bh, bm, bdv), (bh, bm), (bh, bm, bd),
        (bh, s + 1, bm, bd), (b, h, s, taps),
    )  # fmt: skip
    launch(query_backward, (bh, s), q, saved.k_l, saved.u, counts, seg, grad, saved.lse_f,
           dq32, du, dkl_parts, q.stride(0), q.stride(1), q.stride(2), grad.stride(0), grad.stride(1),
           grad.stride(2), h, n, m, d, dv, scale, per_split, s, BN=bn, BM=bm, BD=bd, BDV=bdv, **dots,
           num_warps=warps("query_backward", bm, q.dtype))  # fmt: skip
    launch(landmark_backward, (bh,), saved.q_l, saved.k_l, counts, saved.a, saved.z, saved.iterates,
           saved.bv, du, dkl_parts, dbv, delta, dkl, dql_parts, h, m, d, dv, iterations, s,
           BM=bm, BD=bd, BDV=bdv, num_warps=warps("landmark_backward", bm))  # fmt: skip
    dk = k.new_empty(b, n, h, d).transpose(1, 2)  # (b, h, n, d) head views of token-major memory
    dvv = v.new_empty(b, n, h, dv).transpose(1, 2)
    launch(key_backward, (bh, s), saved.q_l, k, v, seg, counts, saved.lse_b, dbv, delta, dkl, dk, dvv,
           dql_parts, grad, conv_weight if conv else counts, dw_parts,
           k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
           dk.stride(0), dk.stride(1), dk.stride(2), dvv.stride(0), dvv.stride(1), dvv.stride(2),
           grad.stride(0), grad.stride(1), grad.stride(2), h, n, m, d, dv, taps, per_split, s,
           BN=bn, BM=bm, BD=bd, BDV=bdv, BK=block(taps), CONV=conv, **dots,
           num_warps=warps("key_backward", bm, q.dtype))  # fmt: skip
    dql = dql_parts.sum(1)  # (BH, BM, BD): the key splits' and A's parts of dq̃
    dq = q.new_empty(b, n, h, d).transpose(1, 2)
    launch(query_landmarks, (bh * -(-n // bn),), dq32, dql, seg, counts, dq, dq.stride(0), dq.stride(1),
           dq.stride(2), h, n, m, d, scale, BN=bn, BM=bm, BD=bd)  # fmt: skip
    dw = dq32.new_empty(0)
    if conv:  # (h, K): the splits' and samples' parts, in the weight's dtype
        dw = dw_parts.sum((0, 2)).to(conv_weight.dtype)
    return dq, dk, dvv, dw
