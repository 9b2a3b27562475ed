"""``nystrom::iterative_pinv``, the pseudo-inverse as one op: the fused op against the reference iterations, its written-out
backward against autograd through them (float64), its fake kernel, and the Triton kernel under Triton's
CPU interpreter."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nystrom.ops.pinv import iterative_pinv
from nystrom.ops.pinv.naive import reference_pinv
from nystrom.ops.pinv.op import pinv_backward
from nystrom.utils.device import force_accelerator_path

from oracle import rel_err

op = torch.ops.nystrom.iterative_pinv
SRC = Path(__file__).resolve().parents[2] / "src"


def _softmax_matrices(*shape: int) -> torch.Tensor:
    """Rows of a softmax, like the landmark kernel A (every row sums to 1: ‖A‖∞ is a tie of all rows)."""
    return torch.softmax(torch.randn(*shape, dtype=torch.float64) * 2, -1)


def _untied(*shape: int) -> torch.Tensor:
    """Well-conditioned matrices with distinct row and column sums: the norms of Z₀ are smooth there, so
    finite differences (gradcheck) see the same derivative as the analytic one."""
    m = shape[-1]
    return torch.rand(*shape, dtype=torch.float64) + 3 * torch.eye(m, dtype=torch.float64)


@pytest.mark.parametrize("per_matrix", [True, False])
@pytest.mark.parametrize("iterations", [0, 1, 6])
def test_op_equals_the_reference_and_its_backward_equals_autograd_through_it(per_matrix, iterations):
    a = _softmax_matrices(2, 3, 8, 8).requires_grad_()
    z, iterates = op(a, iterations, per_matrix)
    ref = reference_pinv(a, iterations, per_matrix)
    assert torch.equal(z, ref)  # the same arithmetic
    assert iterates.shape == (2, 3, iterations, 8, 8)
    g = torch.randn_like(z)
    (got,) = torch.autograd.grad(z, a, g)
    (want,) = torch.autograd.grad(ref, a, g)
    assert rel_err(got, want) <= 1e-13


@pytest.mark.parametrize("per_matrix", [True, False])
def test_gradcheck_in_float64(per_matrix):
    a = _untied(2, 2, 6, 6).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: op(x, 6, per_matrix)[0], (a,))


def test_the_iteration_converges_to_the_pseudo_inverse_and_the_gradient_to_its_derivative():
    a = _untied(1, 5, 5)
    z, iterates = op(a, 12, True)
    assert rel_err(z, torch.linalg.inv(a)) <= 1e-12
    g = torch.randn_like(a)
    ainv = torch.linalg.inv(a)
    exact = -(ainv.mT @ g @ ainv.mT)  # d(A⁻¹) adjoint
    assert rel_err(pinv_backward(a, iterates, g, True), exact) <= 1e-8


def test_opcheck_schema_fake_kernel_and_autograd_registration():
    a = _untied(2, 3, 4, 4).float().requires_grad_()
    torch.library.opcheck(op, (a, 3, True))
    with torch.device("meta"):
        z, iterates = op(torch.empty(2, 3, 64, 64), 6, True)
    assert z.shape == (2, 3, 64, 64) and iterates.shape == (2, 3, 6, 64, 64)


def test_iterative_pinv_takes_the_op_on_the_accelerator_path_only():
    a = _softmax_matrices(2, 4, 16, 16).requires_grad_()
    g = torch.randn(2, 4, 16, 16, dtype=torch.float64)
    cpu = iterative_pinv(a, 6)
    (cpu_g,) = torch.autograd.grad(cpu, a, g)
    assert cpu.grad_fn.name() != "torch::autograd::CppNode<AutogradFunction>"
    with force_accelerator_path():
        acc = iterative_pinv(a, 6)
        (acc_g,) = torch.autograd.grad(acc, a, g)
    assert torch.equal(acc, cpu)
    assert rel_err(acc_g, cpu_g) <= 1e-13


@pytest.mark.parametrize("backward_inside", [True, False])
def test_the_op_under_bf16_autocast_runs_in_float32_forward_and_backward(backward_inside):
    """Regression: a ``backward()`` inside an autocast block ran the written-out backward's GEMMs in
    bfloat16 and failed on the first in-place accumulation into a float32 buffer ("Bad in-place call")."""
    a = _softmax_matrices(2, 3, 8, 8).float().requires_grad_()
    g = torch.randn(2, 3, 8, 8)
    (want,) = torch.autograd.grad(op(a, 6, True)[0], a, g)
    with torch.autocast("cpu", torch.bfloat16):
        z, _ = op(a.to(torch.bfloat16).float(), 6, True)  # the autocast rule keeps float32 inputs
        assert z.dtype == torch.float32
        low, _ = op(a.to(torch.bfloat16), 6, True)  # and casts bfloat16 ones up
        assert low.dtype == torch.float32
        if backward_inside:
            (got,) = torch.autograd.grad(op(a, 6, True)[0], a, g)
    if not backward_inside:
        with torch.autocast("cpu", torch.bfloat16):
            z = op(a, 6, True)[0]
        (got,) = torch.autograd.grad(z, a, g)
    assert got.dtype == torch.float32
    assert rel_err(got, want) <= 1e-6  # float32 arithmetic, not bfloat16's 3 digits


def test_the_op_keeps_float64_under_autocast():
    a = _softmax_matrices(1, 2, 6, 6).requires_grad_()
    with torch.autocast("cpu", torch.bfloat16):
        z, _ = op(a, 6, True)
        (g,) = torch.autograd.grad(z.sum(), a)
    assert z.dtype == g.dtype == torch.float64
    assert torch.equal(z, reference_pinv(a, 6, True))


def test_one_op_forward_on_the_meta_device():
    from nystrom_lab.bench.launches.count import count_call

    a = torch.randn(1, 12, 64, 64, device="meta", requires_grad=True)
    counts = count_call(lambda: iterative_pinv(a, 6), backward=True)
    assert counts["forward"]["by_op"] == {"iterative_pinv": 1}
    assert counts["forward_backward"]["host_syncs"] == 0
    # the written-out backward (8 GEMMs a step, Z₀'s norms through autograd) against autograd through the
    # reference iterations: 89 and 116 ops at 6 steps
    b = torch.randn(1, 12, 64, 64, device="meta", requires_grad=True)
    ref = count_call(lambda: reference_pinv(b, 6, True), backward=True)
    assert ref["forward"]["ops"] == 74
    assert counts["backward"]["ops"] == 89 < ref["backward"]["ops"] == 116


_INTERPRETED = """
import torch
from nystrom.ops.pinv.naive import reference_pinv
from nystrom.ops.pinv.triton import triton_pinv
torch.manual_seed(0)
for m in (5, 16, 33):
    a = torch.softmax(torch.randn(3, 2, m, m) * 2, -1)
    iterates = torch.empty(3, 2, 6, m, m)
    z = triton_pinv(a, 6, iterates)
    ref = reference_pinv(a.double(), 6, True)
    err = ((z.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-5, (m, err)
    _, ref_it = torch.ops.nystrom.iterative_pinv(a.double(), 6, True)
    it_err = ((iterates.double() - ref_it).norm() / ref_it.norm()).item()
    assert it_err < 1e-5, (m, it_err)
print("ok")
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install triton, Linux): the Triton pinv kernel is tested under its CPU interpreter",
)
def test_triton_kernel_under_the_interpreter_matches_the_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


@pytest.mark.gpu
def test_triton_kernel_on_cuda_matches_the_reference():
    a = torch.softmax(torch.randn(2, 12, 64, 64, device="cuda") * 2, -1)
    z, _ = op(a, 6, True)
    ref = reference_pinv(a.double(), 6, True)
    assert rel_err(z.double(), ref) <= 1e-5
