"""The iterative pseudo-inverse as one Triton kernel (the CUDA forward of ``nystrom::iterative_pinv``).

Legend: B batch of matrices (b·h), m landmarks, M = m rounded up to a power of two ≥ 16 (tl.dot's tile).

One program per matrix keeps A and Z in registers/shared memory for all iterations: the 6 paper
iterations are 24 (m, m) GEMMs and ~20 element-wise steps that would otherwise be ~75 launches per layer.
Products run in IEEE float32 (``input_precision="ieee"``): TF32's 10-bit mantissa would spoil the
13/15/7 polynomial. Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞) per matrix (``init="per_matrix"``).

The kernel is :func:`nystrom.ops.pinv.triton_steps.pinv_kernel`, written with the iteration the fused
Nyström kernels share. Triton is optional: that module imports it and is imported on first use only, so
``TRITON_INTERPRET=1`` (Triton's CPU interpreter, used by the tests) takes effect when set before.
"""

from __future__ import annotations

import importlib.util

import torch

#: the largest m the kernel takes (four (M, M) float32 tiles live per program)
MAX_M = 128


def available() -> bool:
    """Whether Triton is importable."""
    return importlib.util.find_spec("triton") is not None


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
        from nystrom.ops.pinv.triton_steps import pinv_kernel  # imports Triton: on first use only

        pinv_kernel[(batch,)](a, z, iterates, m, iterations, BLOCK=block, DOT="ieee",
                              num_warps=4 if block < 64 else 8)  # fmt: skip
    return z
