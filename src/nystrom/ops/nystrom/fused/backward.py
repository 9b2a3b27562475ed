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

import torch

from nystrom.ops.nystrom.fused.forward import Forward
from nystrom.ops.nystrom.fused.launch import (
    PINV_DOT,
    block,
    dot_options,
    launch,
    scratch,
    splits,
    token_block,
    warps,
)


def backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg: torch.Tensor,
    counts: torch.Tensor,
    spans: torch.Tensor,
    length: int,
    conv_weight: torch.Tensor | None,
    saved: Forward,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk (b, h, n, d), dv (b, h, n, dv) and the conv weight's gradient (h, K) (empty without one)
    for the gradient ``grad`` of the output: four launches and one sum (two with the conv). ``spans``
    (D, 3) and ``length``: the forward's samples (:class:`.plan.Plan`)."""
    b, h, n, d = q.shape
    samples = spans.shape[0]
    dv, m, bh = v.shape[-1], counts.shape[-1], samples * h
    iterations = saved.iterates.shape[1]
    from nystrom.ops.nystrom.fused import backward_kernels as kernels  # imports Triton: first use only

    bm, bd, bdv = block(m), block(d), block(dv)
    bn = token_block("query_backward")  # key_backward and query_landmarks share it (and the splits)
    dots = dot_options(q.dtype)
    per_split, s = splits(length, bh, bn, q.device)
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()  # e.g. a sum's expanded ones: stride 0
    conv = conv_weight is not None
    taps = conv_weight.shape[-1] if conv else 1
    dq32, du, dkl_parts, dbv, delta, dkl, dql_parts, dw_parts = scratch(
        q.device, (b * h, n, d), (bh, s, bm, bdv), (bh, s, bm, bd), (bh, bm, bdv), (bh, bm), (bh, bm, bd),
        (bh, s + 1, bm, bd), (samples, h, s, taps),
    )  # fmt: skip
    launch(kernels.query_backward, (bh, s), q, saved.k_l, saved.u, counts, seg, spans, grad, saved.lse_f,
           dq32, du, dkl_parts, q.stride(0), q.stride(1), q.stride(2), grad.stride(0), grad.stride(1),
           grad.stride(2), h, n, m, d, dv, scale, per_split, s, BN=bn, BM=bm, BD=bd, BDV=bdv, **dots,
           num_warps=warps("query_backward", bm, q.dtype, bd=bd, bdv=bdv))  # fmt: skip
    launch(kernels.landmark_backward, (bh,), saved.q_l, saved.k_l, counts, saved.a, saved.z, saved.iterates,
           saved.bv, du, dkl_parts, dbv, delta, dkl, dql_parts, h, m, d, dv, iterations, s,
           BM=bm, BD=bd, BDV=bdv, PINV_DOT=PINV_DOT, num_warps=warps("landmark_backward", bm, bd=bd, bdv=bdv))  # fmt: skip
    dk = k.new_empty(b, n, h, d).transpose(1, 2)  # (b, h, n, d) head views of token-major memory
    dvv = v.new_empty(b, n, h, dv).transpose(1, 2)
    launch(kernels.key_backward, (bh, s), saved.q_l, k, v, seg, counts, spans, saved.lse_b, dbv, delta, dkl, dk, dvv,
           dql_parts, grad, conv_weight if conv else counts, dw_parts,
           k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
           dk.stride(0), dk.stride(1), dk.stride(2), dvv.stride(0), dvv.stride(1), dvv.stride(2),
           grad.stride(0), grad.stride(1), grad.stride(2), h, n, m, d, dv, taps, per_split, s,
           BN=bn, BM=bm, BD=bd, BDV=bdv, BK=block(taps), CONV=conv, **dots,
           num_warps=warps("key_backward", bm, q.dtype, bd=bd, bdv=bdv))  # fmt: skip
    dql = dql_parts.sum(1)  # (BH, BM, BD): the key splits' and A's parts of dq̃
    dq = q.new_empty(b, n, h, d).transpose(1, 2)
    launch(kernels.query_landmarks, (bh * -(-length // bn),), dq32, dql, seg, counts, spans, dq, dq.stride(0),
           dq.stride(1), dq.stride(2), h, n, length, m, d, scale, BN=bn, BM=bm, BD=bd)  # fmt: skip
    dw = dq32.new_empty(0)
    if conv:  # (h, K): the splits' and samples' parts, in the weight's dtype
        dw = dw_parts.sum((0, 2)).to(conv_weight.dtype)
    return dq, dk, dvv, dw
