"""The reference pseudo-inverse: the iterative method of Razavi et al. (2014) in plain ops.

Legend: B batch dims (b, h), m landmarks, K iterations; Z_k the iterate before step k (Z₀ the start).

As used by the paper: Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ))), Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞).
``per_matrix=True`` scales Z₀ by each matrix's own norms, so one sample's result never depends on its
batch-mates. ``per_matrix=False`` reproduces the official/HF/lucidrains code, which takes the maxima over
the whole batch and all heads; it exists for parity tests only.

This is the op's one reference, a leaf only the tests import: the library runs its own copy of the
iterations (:mod:`nystrom.ops.pinv.iterations`, the CPU path and the op off CUDA) and the Triton kernel,
and the tests compare all of them with this one. It is written on its own, importing neither, so that a
change there cannot change the check too; it does the same arithmetic in the same order, so the plain
paths match it bit for bit. It computes in ``a``'s dtype.
"""

from __future__ import annotations

import torch


def reference_pinv(a: torch.Tensor, iterations: int, per_matrix: bool) -> torch.Tensor:
    """Z_K for square ``a`` (..., m, m): the paper's iterations in plain ops, autograd through all of them.

    ``per_matrix=False`` divides by the largest ‖A‖₁ and the largest ‖A‖∞ over every matrix in ``a``."""
    magnitude = a.abs()  # (B, m, m)
    col_sums = magnitude.sum(-2).amax(-1)  # (B,) ‖A‖₁, the largest column sum
    row_sums = magnitude.sum(-1).amax(-1)  # (B,) ‖A‖∞, the largest row sum
    if per_matrix:
        z = a.mT / (col_sums * row_sums)[..., None, None]  # (B, m, m) Z₀
    else:
        z = a.mT / (col_sums.max() * row_sums.max())  # (B, m, m) Z₀, one scale for the whole batch
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)  # (m, m)
    for _ in range(iterations):
        az = a @ z  # (B, m, m)
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z
