"""The pseudo-inverse's entry points: checks, then the op's one choice of implementation.

Legend: b batch, h heads, m landmarks.

:func:`iterative_pinv` (Razavi et al. 2014, the paper's method; the formula is in :mod:`.iterations`) runs
the plain-ops iterations of :mod:`.iterations` on the CPU path and the ``nystrom::iterative_pinv`` op
(:mod:`.op`: one Triton launch on CUDA, a written-out backward) on the accelerator path.
``init="per_matrix"`` scales Z₀ by each matrix's own norms; ``init="original"`` takes the batch-wide
maxima of the public codes (parity only). The tests check both paths against :mod:`.naive`.
"""

from __future__ import annotations

import torch

from nystrom.ops.pinv import op as _op  # noqa: F401  (registers nystrom::iterative_pinv)
from nystrom.ops.pinv.iterations import cpu_pinv
from nystrom.utils.checks import check_choice, check_positive_int
from nystrom.utils.device import accelerator_path

PINV_INITS = ("per_matrix", "original")


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half precision cannot hold the 13/15/7 polynomial accurately: always iterate in ≥ float32.
    return torch.promote_types(dtype, torch.float32)


def iterative_pinv(a: torch.Tensor, iterations: int = 6, init: str = "per_matrix") -> torch.Tensor:
    """Iterative pseudo-inverse of ``a`` (..., m, m); returns (..., m, m) in float32 or wider.

    Args:
        a: square matrices, any leading batch dims.
        iterations: number of Newton–Schulz-type steps (the paper uses 6).
        init: ``"per_matrix"`` (default) or ``"original"`` (batch-wide scaling of Z₀, for parity).
    """
    if not isinstance(a, torch.Tensor) or a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        shape = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
        raise ValueError(f"a must be a (..., m, m) tensor of square matrices, got {shape}")
    if not a.is_floating_point():
        raise TypeError(f"a must be a floating-point tensor, got {a.dtype}")
    check_positive_int("iterations", iterations, minimum=0)
    check_choice("init", init, PINV_INITS)
    a = a.to(_work_dtype(a.dtype))
    if accelerator_path(a):  # one launch (Triton on CUDA) and a written-out backward: op.py
        return torch.ops.nystrom.iterative_pinv(a, iterations, init == "per_matrix")[0]
    return cpu_pinv(a, iterations, init == "per_matrix")  # CPU: plain ops, no op dispatch or iterates


def exact_pinv(a: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.pinv`` of ``a`` (..., m, m) in float32 or wider (SVD based; for oracles and m = n checks)."""
    return torch.linalg.pinv(a.to(_work_dtype(a.dtype)))
