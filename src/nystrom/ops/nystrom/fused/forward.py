"""The fused forward: Nyström attention in five Triton kernels.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim, s score scale; D samples (the
rows, or packed documents: :mod:`.plan`), L the longest sample, BH = D·h program rows; S splits of the
tokens; BM, BD, BDV, BN tile sizes (powers of two ≥ 16: m, d, dv and a token block).

Every sample has its own landmarks and runs over its own span of its row: the per-landmark state is per
(sample, head), the per-token outputs and the log-sum-exps per (row, head).

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

The kernels are module-level functions in :mod:`.forward_kernels`, which imports Triton and is imported on
first use, so ``TRITON_INTERPRET=1`` set before then runs them with Triton's CPU interpreter (the tests do).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nystrom.ops.nystrom.fused.launch import (
    PINV_DOT,
    TOKEN_BLOCK,
    block,
    dot_options,
    join,
    launch,
    on_stream,
    scratch,
    side_stream,
    splits,
    token_block,
    warps,
)


class Forward(NamedTuple):
    """The output and what the backward reads (no n×m matrix: it recomputes those)."""

    out: torch.Tensor  # (b, h, n, dv), a head view of (b, n, h, dv) memory
    q_l: torch.Tensor  # (BH, m, d) float32, q̃ times the scale (BH = samples × heads)
    k_l: torch.Tensor  # (BH, m, d) float32
    a: torch.Tensor  # (BH, m, m) float32
    iterates: torch.Tensor  # (BH, K, m, m) float32
    z: torch.Tensor  # (BH, m, m) float32 A⁺
    bv: torch.Tensor  # (BH, m, dv) float32 B·V
    lse_b: torch.Tensor  # (BH, m) float32 log-sum-exp of B's rows
    u: torch.Tensor  # (BH, m, dv) in the inputs' dtype, A⁺·(B·V)
    lse_f: torch.Tensor  # (b·h, n) float32 log-sum-exp of F's rows


def outputs(q: torch.Tensor, v: torch.Tensor, m: int, iterations: int, samples: int) -> Forward:
    """The forward's output tensors, allocated (also the op's fake kernel)."""
    b, h, n, d = q.shape
    dv, bh = v.shape[-1], samples * h
    f32 = dict(dtype=torch.float32, device=q.device)
    return Forward(
        q.new_empty(b, n, h, dv).transpose(1, 2),  # (b, h, n, dv): the heads merge as a view
        torch.empty(bh, m, d, **f32), torch.empty(bh, m, d, **f32), torch.empty(bh, m, m, **f32),
        torch.empty(bh, iterations, m, m, **f32), torch.empty(bh, m, m, **f32), torch.empty(bh, m, dv, **f32),
        torch.empty(bh, m, **f32), torch.empty(bh, m, dv, dtype=q.dtype, device=q.device), torch.empty(b * h, n, **f32),
    )  # fmt: skip


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg: torch.Tensor,
    bounds: torch.Tensor,
    counts: torch.Tensor,
    spans: torch.Tensor,
    length: int,
    conv_weight: torch.Tensor | None,
    scale: float,
    iterations: int,
) -> Forward:
    """The five launches on q, k (b, h, n, d) and v (b, h, n, dv) with unit stride in the last dim, for
    the samples of ``spans`` (D, 3), the longest ``length`` tokens (:class:`.plan.Plan`);
    ``conv_weight`` (h, K) or None: the conv skip of v, added in the query pass (read as float32)."""
    b, h, n, d = q.shape
    dv, m, bh = v.shape[-1], counts.shape[-1], spans.shape[0] * h
    from nystrom.ops.nystrom.fused import forward_kernels as kernels  # imports Triton: first use only

    bm, bd, bdv, bn = block(m), block(d), block(dv), TOKEN_BLOCK
    bk, bq = token_block("key_pass"), token_block("query_pass")  # the passes' token blocks (tunable)
    res = outputs(q, v, m, iterations, spans.shape[0])
    launch(kernels.landmarks, (bh, m), q, k, seg, bounds, counts, spans, res.q_l, res.k_l,
           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           h, n, m, d, scale, BN=bn, BD=bd)  # fmt: skip
    side = side_stream(q.device, "landmark_pinv")  # None unless tuned to overlap the key pass
    with on_stream(side):
        launch(kernels.landmark_pinv, (bh,), res.q_l, res.k_l, counts, res.a, res.z, res.iterates, h, m, d,
               iterations, BM=bm, BD=bd, PINV_DOT=PINV_DOT, num_warps=warps("landmark_pinv", bm, bd=bd))  # fmt: skip
    per_split, s = splits(length, bh, bk, q.device)
    acc, stat = scratch(q.device, (bh, s, bm, bdv), (bh, s, 2, bm))  # the splits' partial B·V and stats
    dots = dot_options(q.dtype)
    launch(kernels.key_pass, (bh, s), res.q_l, k, v, seg, spans, acc, stat,
           k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
           h, n, m, d, dv, per_split, s, BM=bm, BN=bk, BD=bd, BDV=bdv, **dots,
           num_warps=warps("key_pass", bm, q.dtype, bd=bd, bdv=bdv))  # fmt: skip
    join(side)  # key_combine reads A⁺
    launch(kernels.key_combine, (bh,), acc, stat, res.z, res.bv, res.lse_b, res.u, m, dv, s, BM=bm, BDV=bdv, PINV_DOT=PINV_DOT,
           num_warps=warps("key_combine", bm, q.dtype, bdv=bdv))  # fmt: skip
    conv = conv_weight is not None
    out = res.out
    launch(kernels.query_pass, (bh * -(-length // bq),), q, res.k_l, res.u, counts, seg, spans, v,
           conv_weight if conv else counts, out, res.lse_f,
           q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2),
           out.stride(0), out.stride(1), out.stride(2), h, n, length, m, d, dv, conv_weight.shape[-1] if conv else 1, scale,
           BN=bq, BM=bm, BD=bd, BDV=bdv, CONV=conv, **dots, num_warps=warps("query_pass", bm, q.dtype, bd=bd, bdv=bdv))  # fmt: skip
    return res
