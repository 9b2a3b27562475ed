"""The pseudo-inverse's iterations as the library runs them: the CPU implementation, in plain ops.

Legend: B batch dims (b, h), m landmarks, K iterations; Z_k the iterate before step k (Z₀ the start).

The iterative method of Razavi et al. (2014), as used by the paper:
Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ))), Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞).
``per_matrix=True`` scales Z₀ by each matrix's own norms, so one sample's result never depends on its
batch-mates. ``per_matrix=False`` reproduces the official/HF/lucidrains code, which takes the maxima over
the whole batch and all heads; it exists for parity tests only.

The CPU path (:func:`nystrom.ops.pinv.dispatch.iterative_pinv`) calls :func:`cpu_pinv`; the op
(:mod:`nystrom.ops.pinv.op`) runs :func:`run_iterations` off CUDA (recording the iterates for its
backward) and takes Z₀'s gradient through :func:`initial_iterate`. The tests check all of it against
:mod:`nystrom.ops.pinv.naive`, the reference written on its own. Everything computes in ``a``'s dtype;
the entry point promotes half precision first.
"""

from __future__ import annotations

import torch


def initial_iterate(a: torch.Tensor, per_matrix: bool) -> torch.Tensor:
    """Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞): per matrix, or (``per_matrix=False``) with the public code's batch-wide
    maxima."""
    absa = a.abs()
    norm_1 = absa.sum(-2).amax(-1)  # (B,) max column sum
    norm_inf = absa.sum(-1).amax(-1)  # (B,) max row sum
    denom = (norm_1 * norm_inf)[..., None, None] if per_matrix else norm_1.max() * norm_inf.max()
    return a.mT / denom  # (B, m, m)


def run_iterations(
    a: torch.Tensor, iterations: int, per_matrix: bool, iterates: torch.Tensor | None
) -> torch.Tensor:
    """Z_K; with ``iterates`` (..., K, m, m) given, Z_0 … Z_{K-1} are written into it for the backward."""
    z = initial_iterate(a, per_matrix)
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    for k in range(iterations):
        if iterates is not None:
            iterates[..., k, :, :] = z
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def cpu_pinv(a: torch.Tensor, iterations: int, per_matrix: bool) -> torch.Tensor:
    """Z_K for square ``a`` (..., m, m) in plain ops, autograd through every step: on the CPU the op's
    dispatch and its recorded iterates would cost more than they save."""
    return run_iterations(a, iterations, per_matrix, None)
