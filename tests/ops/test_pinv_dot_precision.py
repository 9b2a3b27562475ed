"""Which ``tl.dot`` input precisions the pseudo-inverse's m×m products may run in on a GPU's tensor cores.

The per-head kernels (``landmark_pinv``, ``key_combine``, ``landmark_backward``, and ``nystrom::iterative_pinv``'s
kernel) multiply float32 m×m tiles about 25 times in a dependent chain. IEEE float32 runs on CUDA cores;
Triton 3.9 can run them on tensor cores as ``"tf32x3"`` (three TF32 products of a hi/lo split) or
``"bf16x3"``/``"bf16x6"`` (three or six bfloat16 products). Triton's interpreter ignores the precision, so
the arithmetic is emulated here in PyTorch (each operand split into parts rounded to the format, the
parts' products summed in float32) and the 6-iteration pinv of softmax matrices like A is compared with
float64: a precision the GPU sweep may choose must stay within 2× IEEE float32's error; plain ``"tf32"``
(10-bit mantissas) is what the kernels must never use (its error is ~1000× IEEE's: the polynomial's
13/15/7 coefficients amplify it).
"""

from __future__ import annotations

import pytest
import torch

from nystrom.ops.nystrom.fused.launch import PINV_DOTS
from nystrom.ops.pinv.naive import reference_pinv


def _round(x: torch.Tensor, dropped: int) -> torch.Tensor:
    """float32 ``x`` rounded to nearest with its last ``dropped`` mantissa bits cleared."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + (1 << (dropped - 1))) & ~((1 << dropped) - 1)).view(torch.float32)


def _parts(x: torch.Tensor, dropped: int, count: int) -> list[torch.Tensor]:
    out = []
    for _ in range(count):
        out.append(_round(x, dropped))
        x = x - out[-1]
    return out


def _product(precision: str):
    """``a @ b`` (float32) as a tensor core computes it with ``tl.dot(..., input_precision=precision)``."""
    if precision == "ieee":
        return torch.matmul
    dropped, count, pairs = {
        "tf32": (13, 1, [(0, 0)]),
        "tf32x3": (13, 2, [(0, 1), (1, 0), (0, 0)]),
        "bf16x3": (16, 2, [(0, 1), (1, 0), (0, 0)]),
        "bf16x6": (16, 3, [(0, 2), (1, 1), (2, 0), (0, 1), (1, 0), (0, 0)]),
    }[precision]  # the small terms first, as Triton sums them

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        pa, pb = _parts(a, dropped, count), _parts(b, dropped, count)
        out = torch.zeros(a.shape[:-1] + b.shape[-1:], dtype=torch.float32)
        for i, j in pairs:
            out = out + pa[i] @ pb[j]
        return out

    return mm


def _pinv(a: torch.Tensor, mm, iterations: int = 6) -> torch.Tensor:
    """The kernels' iteration (per-matrix Z₀) with every product through ``mm``."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype)
    absa = a.abs()
    z = a.transpose(-1, -2) / (absa.sum(-2).amax(-1) * absa.sum(-1).amax(-1))[..., None, None]
    for _ in range(iterations):
        az = mm(a, z)
        t = mm(az, 15 * eye - mm(az, 7 * eye - az))
        z = mm(0.25 * z, 13 * eye - t)
    return z


def _landmark_matrices(seed: int, sharpness: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ql, kl = (torch.randn(8, 64, 64, generator=g) for _ in range(2))
    return torch.softmax(ql @ kl.transpose(-1, -2) / 64 * sharpness, -1)  # (8, m, m) like A


def _error(a: torch.Tensor, precision: str) -> float:
    ref = reference_pinv(a.double(), 6, True)
    z = _pinv(a, _product(precision))
    return ((z.double() - ref).norm() / ref.norm()).item()


def test_the_emulated_ieee_iteration_is_the_reference():
    a = _landmark_matrices(0, 4.0)
    assert _error(a, "ieee") <= 2e-6


@pytest.mark.parametrize("sharpness", [1.0, 4.0, 16.0])
@pytest.mark.parametrize("precision", sorted(PINV_DOTS))
def test_the_precisions_the_sweep_may_choose_stay_within_twice_ieee(precision, sharpness):
    a = _landmark_matrices(1, sharpness)
    bound = {"ieee": 1.0, "tf32x3": 2.0, "bf16x6": 2.0}[precision]
    assert _error(a, precision) <= bound * max(_error(a, "ieee"), 1e-7)


def test_tf32_and_bf16x3_are_too_coarse_for_the_pinv():
    """Why they are not in :data:`PINV_DOTS`: tf32 ~1000× and bf16x3 ~30× IEEE float32's error."""
    a = _landmark_matrices(2, 4.0)
    ieee = _error(a, "ieee")
    assert _error(a, "tf32") >= 300 * ieee
    assert _error(a, "bf16x3") >= 8 * ieee
