"""The iterative pseudo-inverse as one Triton kernel (the CUDA forward of ``nystrom::iterative_pinv``).

Legend: B batch of matrices (b·h), m landmarks, M = m rounded up to a power of two ≥ 16 (tl.dot's tile).

One program per matrix keeps A and Z in registers/shared memory for all iterations: the 6 paper
iterations are 24 (m, m) GEMMs and ~20 element-wise steps that would otherwise be ~75 launches per layer.
Products run in IEEE float32 (``input_precision="ieee"``): TF32's 10-bit mantissa would spoil the
13/15/7 polynomial. Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞) per matrix (``init="per_matrix"``).

Triton is optional and imported on first use only; the kernel is built then too, so
``TRITON_INTERPRET=1`` (Triton's CPU interpreter, used by the tests) takes effect when set before.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

#: the largest m the kernel takes (four (M, M) float32 tiles live per program)
MAX_M = 128


def available() -> bool:
    """Whether Triton is importable."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def pinv_kernel(a_ptr, z_ptr, it_ptr, m, iterations, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        rows = tl.arange(0, BLOCK)[:, None]
        cols = tl.arange(0, BLOCK)[None, :]
        inside = (rows < m) & (cols < m)
        base = pid * m * m
        a = tl.load(a_ptr + base + rows * m + cols, mask=inside, other=0.0)  # (M, M), zero outside m
        absa = tl.abs(a)
        norm_1 = tl.max(tl.sum(absa, axis=0), axis=0)  # max column sum
        norm_inf = tl.max(tl.sum(absa, axis=1), axis=0)  # max row sum
        z = tl.trans(a) / (norm_1 * norm_inf)
        eye = tl.where((rows == cols) & inside, 1.0, 0.0)  # zero outside m: the padding stays zero
        it_base = it_ptr + pid * iterations * m * m
        for k in range(iterations):
            tl.store(it_base + k * m * m + rows * m + cols, z, mask=inside)  # Z_k, for the backward
            az = tl.dot(a, z, input_precision="ieee")
            t = 7.0 * eye - az
            t = 15.0 * eye - tl.dot(az, t, input_precision="ieee")
            t = 13.0 * eye - tl.dot(az, t, input_precision="ieee")
            z = tl.dot(0.25 * z, t, input_precision="ieee")
        tl.store(z_ptr + base + rows * m + cols, z, mask=inside)

    return pinv_kernel


def supports(a: torch.Tensor) -> bool:
    """Whether the kernel takes ``a`` (..., m, m): float32 and m ≤ :data:`MAX_M`."""
    return a.dtype == torch.float32 and a.shape[-1] <= MAX_M


def triton_pinv(a: torch.Tensor, iterations: int, iterates: torch.Tensor) -> torch.Tensor:
    """Z after ``iterations`` steps from the per-matrix Z₀, for float32 ``a`` (..., m, m), m ≤ MAX_M;
    Z_0 … Z_{K-1} are written into ``iterates`` (..., K, m, m), contiguous."""
    if not supports(a):
        raise ValueError(
            f"the Triton pinv takes float32 (..., m, m) with m <= {MAX_M}, got {a.dtype} {tuple(a.shape)}"
        )
    m = a.shape[-1]
    a = a.contiguous()
    z = torch.empty_like(a)
    batch = a.numel() // (m * m)
    if batch:
        block = max(16, 1 << (m - 1).bit_length())
        _kernel()[(batch,)](a, z, iterates, m, iterations, BLOCK=block, num_warps=4 if block < 64 else 8)
    return z
