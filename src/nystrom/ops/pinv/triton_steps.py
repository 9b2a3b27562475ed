"""The iterative pseudo-inverse in Triton, written once: device functions that the pinv op's kernel
(:func:`pinv_kernel`, below) and the fused Nyström kernels (``ops/nystrom/fused``) inline.

Legend: M the m×m tile side (m rounded up to a power of two ≥ 16); Z_k the iterate before step k.

The maths is :mod:`nystrom.ops.pinv.naive`'s (Razavi et al.): Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞), and with
Y = A Z_k, P = 7I − Y, Q = 15I − Y P, R = 13I − Y Q, Z_{k+1} = ¼ Z_k R. The reverse sweep (the formulas
are in :mod:`nystrom.ops.pinv.op`) takes ¼ of the gradient of Z_{k+1} and gives ¼ of Z_k's and this
step's part of dA; :func:`initial_iterate_backward` adds Z₀'s (its norms included).

``DOT`` is the m×m products' ``tl.dot`` input precision: ``"ieee"`` (float32 on CUDA cores) or a
tensor-core split such as ``"tf32x3"`` (:data:`nystrom.ops.nystrom.fused.launch.PINV_DOTS`); plain TF32
would spoil the 13/15/7 polynomial.

This module imports Triton: it is imported on first use only (the kernels' hosts import it inside their
launchers), so ``TRITON_INTERPRET=1`` set before then runs it with Triton's CPU interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def initial_iterate(a):
    """Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞) of the (M, M) tile ``a`` (zero outside m)."""
    absa = tl.abs(a)
    norm_1 = tl.max(tl.sum(absa, axis=0), axis=0)  # max column sum
    norm_inf = tl.max(tl.sum(absa, axis=1), axis=0)  # max row sum
    return tl.trans(a) / (norm_1 * norm_inf)


@triton.jit
def iterate(a, eye, it_ptrs, inside, step, iterations, DOT: tl.constexpr):
    """Z_K from Z₀ for the (M, M) tile ``a``; Z_0 … Z_{K-1} are stored at ``it_ptrs + k·step`` (the
    backward's), masked by ``inside``. ``eye`` is I on the m×m block and 0 outside (padding stays 0)."""
    z = initial_iterate(a)
    for k in range(iterations):
        tl.store(it_ptrs + k * step, z, mask=inside)  # Z_k, for the backward
        az = tl.dot(a, z, input_precision=DOT)
        t = 7.0 * eye - az
        t = 15.0 * eye - tl.dot(az, t, input_precision=DOT)
        t = 13.0 * eye - tl.dot(az, t, input_precision=DOT)
        z = tl.dot(0.25 * z, t, input_precision=DOT)
    return z


@triton.jit
def reverse_step(a_ptrs, inside, zk, hk, diag, DOT: tl.constexpr):
    """One step back: ``hk`` is ¼ of the gradient of Z_{k+1}; returns (¼ of Z_k's gradient, this step's
    part of dA). A is re-read from ``a_ptrs`` (L1/L2) where it is needed instead of kept live: each m×m
    tile dies early, which is what keeps the sweep's registers in bounds."""
    a = tl.load(a_ptrs, mask=inside, other=0.0)
    y = tl.dot(a, zk, input_precision=DOT)
    pk = tl.where(diag, 7.0 - y, -y)  # 7I − Y
    qk = tl.where(diag, 15.0, 0.0) - tl.dot(y, pk, input_precision=DOT)
    rk = tl.where(diag, 13.0, 0.0) - tl.dot(y, qk, input_precision=DOT)
    dr = tl.dot(tl.trans(zk), hk, input_precision=DOT)  # ∂R
    hk = tl.dot(hk, tl.trans(rk), input_precision=DOT)  # G Rᵀ, the first half of ¼ ∂Z_k
    dq = tl.dot(tl.trans(y), dr, input_precision=DOT)  # −∂Q
    dy = -tl.dot(dr, tl.trans(qk), input_precision=DOT)
    dy += tl.dot(dq, tl.trans(pk), input_precision=DOT)
    dy -= tl.dot(tl.trans(y), dq, input_precision=DOT)  # ∂Y = −∂P − ∂R Qᵀ − ∂Q Pᵀ, ∂P = Yᵀ(−∂Q)
    da = tl.dot(dy, tl.trans(zk), input_precision=DOT)
    a = tl.load(a_ptrs, mask=inside, other=0.0)
    hk = 0.25 * (hk + tl.dot(tl.trans(a), dy, input_precision=DOT))
    return hk, da


@triton.jit
def initial_iterate_backward(a, g0, rows):
    """dA through Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞) for Z₀'s gradient ``g0``: the transpose's part and the two norms'
    (a subgradient at the arg-max column and row). ``rows`` is ``tl.arange(0, M)``."""
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
    da = c * tl.trans(g0)
    return da - (tl.where(col_max, inner / norm_1 * sign, 0.0) + tl.where(row_max, inner / norm_inf * sign, 0.0))


@triton.jit
def pinv_kernel(a_ptr, z_ptr, it_ptr, m, iterations, BLOCK: tl.constexpr, DOT: tl.constexpr):
    """``nystrom::iterative_pinv``'s CUDA forward: one program per matrix of a (B, m, m) batch."""
    pid = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    inside = (rows < m) & (cols < m)
    base = pid * m * m
    a = tl.load(a_ptr + base + rows * m + cols, mask=inside, other=0.0)  # (M, M), zero outside m
    eye = tl.where((rows == cols) & inside, 1.0, 0.0)  # zero outside m: the padding stays zero
    z = iterate(a, eye, it_ptr + pid * iterations * m * m + rows * m + cols, inside, m * m, iterations, DOT)
    tl.store(z_ptr + base + rows * m + cols, z, mask=inside)
