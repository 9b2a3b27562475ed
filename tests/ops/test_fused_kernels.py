"""The fused Triton kernels of Nyström attention (``nystrom.ops.nystrom.fused``).

On a machine without CUDA they run on CPU tensors under Triton's interpreter, at small sizes: conftest.py
sets ``TRITON_INTERPRET=1`` there before anything imports triton.
The same checks run on CUDA at real sizes under the ``gpu`` marker.

Each call is compared with the float64 oracle (the materialised reference) and with the PyTorch path in
the same dtype, forward and every gradient; padded tokens hold NaN where the test says so.
"""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nystrom import NystromAttention, nystrom_attention
from nystrom.ops.conv.naive import reference_conv_skip
from nystrom.ops.nystrom import fused
from nystrom.ops.nystrom.fused import LAUNCHES, fused_kernels
from nystrom.ops.nystrom.fused import backward as fused_backward
from nystrom.ops.nystrom.fused import forward as fused_forward
from nystrom.ops.nystrom.fused import launch as fused_launch
from nystrom.ops.nystrom.fused import op as fused_op
from nystrom.ops.nystrom.fused.launch import split_programs, tuned
from nystrom.ops.nystrom.fused.op import fused_attention_backward_op, fused_attention_op
from nystrom.ops.nystrom.fused.plan import plan
from nystrom.ops.nystrom.landmarks import landmark_assignment
from nystrom.ops.nystrom.naive import nystrom_attention_materialized
from nystrom.utils import checks
from nystrom_lab.bench.launches.count import counting, summary

from oracle import rel_err, right_pad_mask

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (pip install triton, Linux)"
)


def _half_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """The error model of the half-precision kernels, in the dtype's unit roundoff u (2⁻⁸ bf16, 2⁻¹¹ fp16).
    Everything accumulates in float32 and the landmarks, A, A⁺ and B·V stay float32; what is rounded to
    the dtype is q, k and v themselves, k̃ and U = A⁺·(B·V) where the large products take them, and P_F
    before its product with U: four roundings of relative size u on the output's path, so ≲ 4u (measured
    2.2u bf16, 0.9u fp16 over six seeds); the backward adds the roundings of dO's products, dS_F, P_B and
    dS_B (≲ 12u; measured 4.8u, 1.8u). Allowed: 5u and 15u."""
    u = torch.finfo(dtype).eps / 2
    return 5 * u, 15 * u


#: relative error allowed against the float64 oracle: outputs, gradients. float32: its rounding (6e-8)
#: amplified by the 6 pinv iterations and the softmaxes; half precision: :func:`_half_tolerance`
TOLERANCE = {torch.float32: (2e-5, 1e-4), **{dt: _half_tolerance(dt) for dt in (torch.bfloat16, torch.float16)}}


def _interpreted():
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the gpu-marked tests run the kernels there")
    return "cpu"


@pytest.fixture(params=[pytest.param("cpu", id="interpreted"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """The kernels under Triton's interpreter on the CPU, and the same test on CUDA under the gpu marker
    (a machine with CUDA runs only the latter)."""
    if request.param == "cpu":
        return _interpreted()
    return request.param


def _inputs(b, h, n, d, dv, dtype, device, *, nan_mask=None):
    q, k = (torch.randn(b, h, n, d, device=device).to(dtype) for _ in range(2))
    v = torch.randn(b, h, n, dv, device=device).to(dtype)
    if nan_mask is not None:  # padded positions hold NaN: they must never be read
        pad = ~nan_mask.to(device)[:, None, :, None]
        q, k, v = (t.masked_fill(pad, float("nan")) for t in (q, k, v))
    return [t.requires_grad_() for t in (q, k, v)]


def _grads(out, inputs, weight):
    return torch.autograd.grad((out.float() * weight).sum(), inputs)


def _check_against_oracle(device, dtype, b, h, n, d, dv, m, lengths, segments, nan_padding, taps=None, *,
                          mask=None):  # fmt: skip
    """Forward and every gradient against the float64 oracle; ``lengths`` (right padding) or ``mask``."""
    if mask is None:
        mask = None if lengths is None else right_pad_mask(lengths, n)
    mask = None if mask is None else mask.to(device)
    q, k, v = _inputs(b, h, n, d, dv, dtype, device, nan_mask=mask if nan_padding else None)
    conv = None if taps is None else (torch.randn(h, 1, taps, 1, device=device) / taps).requires_grad_()
    options = dict(num_landmarks=m, mask=mask, segments=segments)
    before = LAUNCHES["query_pass"]
    with fused_kernels(True):
        out = nystrom_attention(q, k, v, **options, conv_weight=conv)
    assert LAUNCHES["query_pass"] == before + 1  # the fused kernels ran
    real = torch.ones(b, n, dtype=torch.bool, device=device) if mask is None else mask
    weight = torch.randn(out.shape, device=device) * real[:, None, :, None]  # a loss over real rows
    inputs = (q, k, v) if conv is None else (q, k, v, conv)
    got = _grads(out, inputs, weight)
    clean = [t.detach().double().nan_to_num(0.0).requires_grad_() for t in inputs]
    ref = nystrom_attention_materialized(*clean[:3], **options)
    if conv is not None:  # the skip of the zeroed v
        ref = ref + reference_conv_skip(clean[2] * real[:, None, :, None], clean[3])
    want = _grads(ref, clean, weight.double())
    out_tol, grad_tol = TOLERANCE[dtype]
    w = real[:, None, :, None]
    assert rel_err(out.double() * w, ref * w) <= out_tol
    assert torch.isfinite(out).all()
    for name, g, r in zip(("q", "k", "v", "conv"), got, want):
        assert torch.isfinite(g).all(), name
        assert rel_err(g, r) <= grad_tol, name
        if mask is not None and name != "conv":
            assert (g * ~w).abs().max() == 0, name  # padded positions get no gradient


CASES = [  # b, h, n, d, dv, m, lengths, segments, conv taps
    pytest.param(2, 2, 37, 16, 16, 8, None, "balanced", None, id="nomask-n-not-multiple-of-m"),
    pytest.param(2, 2, 40, 16, 16, 8, None, "balanced", None, id="nomask-n-multiple-of-m"),
    pytest.param(2, 3, 37, 32, 16, 8, [37, 29], "balanced", None, id="padded-d32-dv16"),
    pytest.param(2, 1, 30, 16, 16, 16, [30, 9], "balanced", None, id="padded-fewer-real-than-m"),
    pytest.param(1, 2, 45, 16, 16, 8, [40], "front_padded", None, id="front-padded-segments"),
    pytest.param(1, 1, 70, 64, 64, 33, [61], "balanced", None, id="d64-m33"),
    pytest.param(1, 1, 20, 16, 16, 32, None, "balanced", None, id="m-above-n"),
    pytest.param(2, 2, 37, 16, 16, 8, [37, 20], "balanced", 5, id="conv-5-padded"),
    pytest.param(1, 2, 90, 16, 32, 8, [80], "balanced", 65, id="conv-65-dv32"),
]


@pytest.mark.parametrize("b, h, n, d, dv, m, lengths, segments, taps", CASES)
def test_fused_equals_the_oracle(b, h, n, d, dv, m, lengths, segments, taps, device):
    _check_against_oracle(device, torch.float32, b, h, n, d, dv, m, lengths, segments, False, taps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fused_half_precision_equals_the_oracle(dtype, device):
    _check_against_oracle(device, dtype, 2, 2, 37, 16, 16, 8, [37, 25], "balanced", False, 5)


def test_nan_in_padded_positions_changes_nothing(device):
    _check_against_oracle(device, torch.float32, 2, 2, 37, 16, 16, 8, [37, 21], "balanced", True, 7)


def _masks(kind: str, b: int, n: int) -> torch.Tensor:
    if kind == "holes":
        mask = torch.rand(b, n, generator=torch.Generator().manual_seed(3)) > 0.4
        mask[:, 0] = True
        return mask
    if kind == "left-padded":
        return right_pad_mask([n, n - 9], n).flip(-1)
    return right_pad_mask([5, 3], n)  # fewer real tokens than m


@pytest.mark.parametrize("kind", ["holes", "left-padded", "fewer-real-than-m"])
@pytest.mark.parametrize("segments", ["balanced", "front_padded"])
def test_any_mask_not_only_right_padding(kind, segments, device):
    """Outputs and every gradient (the conv's too) under any mask, NaN in the padded positions."""
    mask = _masks(kind, 2, 33)
    _check_against_oracle(device, torch.float32, 2, 2, 33, 16, 16, 8, None, segments, True, 5, mask=mask)


def test_fused_equals_the_pytorch_path_with_a_loss_over_every_row():
    """The same function as the PyTorch path, padded rows' outputs included (their gradients reach the
    real tokens through k̃ and A⁺·(B·V))."""
    device = _interpreted()
    mask = right_pad_mask([37, 23], 37)
    q, k, v = _inputs(2, 2, 37, 16, 16, torch.float32, device)
    weight = torch.randn(2, 2, 37, 16)
    with fused_kernels(True):
        out = nystrom_attention(q, k, v, num_landmarks=8, mask=mask)
        got = _grads(out, (q, k, v), weight)
    with fused_kernels(False):
        ref = nystrom_attention(q, k, v, num_landmarks=8, mask=mask)
        want = _grads(ref, (q, k, v), weight)
    assert rel_err(out, ref) <= 2e-6
    for g, r in zip(got, want):
        assert rel_err(g, r) <= 2e-5


@pytest.mark.parametrize("taps", [None, 65], ids=["no-conv", "conv-65"])
def test_launches_per_call(taps, monkeypatch):
    """Exactly five Triton launches forward and no ATen op; four launches and one ATen sum backward (two
    with the conv skip): 10 (11) per forward and backward. Counted in the op's real Python on meta
    tensors, launches recorded instead of run, and no host sync (the mask's plan is computed once per
    forward for all layers, outside)."""
    forward, backward, forward_ops, backward_ops = _recorded_launches(
        monkeypatch, 2, 8, 4096, taps=taps, mask=right_pad_mask([4096, 3000], 4096).to("meta")
    )
    assert [name for name, _ in forward] == ["landmarks", "landmark_pinv", "key_pass", "key_combine", "query_pass"]
    assert [name for name, _ in backward] == ["query_backward", "landmark_backward", "key_backward", "query_landmarks"]
    assert forward_ops["by_op"] == {}
    assert backward_ops["by_op"] == {"sum": 1 if taps is None else 2}
    assert len(forward) + len(backward) + backward_ops["ops"] == (10 if taps is None else 11)
    assert forward_ops["host_syncs"] == backward_ops["host_syncs"] == 0


def test_a_call_without_a_mask_dispatches_one_op_each_way():
    """``nystrom_attention`` on meta (what CUDA dispatches), bf16, 4K, no mask: the plan is a function of
    the shape, computed on the first call and kept, so every later call is the op alone: 1 ATen op
    forward; backward the op and the three copies that lay the gradients out as the leaves are."""
    q, k, v = (torch.empty(1, 8, 4096, 64, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    nystrom_attention(q, k, v, num_landmarks=64)  # the first call computes the plan
    with counting() as forward_count:
        out = nystrom_attention(q, k, v, num_landmarks=64)
    with counting() as backward_count:
        out.backward(torch.empty_like(out))
    forward_ops, backward_ops = summary(forward_count), summary(backward_count)
    assert forward_ops["by_op"] == {"fused_attention": 1}
    assert backward_ops["by_op"] == {"fused_attention_backward": 1, "copy_": 3}
    assert forward_ops["host_syncs"] == backward_ops["host_syncs"] == 0


def test_a_loss_whose_gradient_is_expanded_ones(device):
    """``out.sum()`` hands the backward a stride-0 gradient (regression: the kernels read it as rows)."""
    q, k, v = _inputs(1, 2, 37, 16, 16, torch.float32, device)
    grads = []
    for enabled in (True, False):
        with fused_kernels(enabled):
            grads.append(torch.autograd.grad(nystrom_attention(q, k, v, num_landmarks=8).sum(), (q, k, v)))
    for g, r in zip(*grads):
        assert rel_err(g, r) <= 2e-5


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(dict(num_landmarks=256), id="m-256"),
        pytest.param(dict(num_landmarks=128), id="m-128"),
        pytest.param(dict(num_landmarks=8, pinv="exact"), id="exact-pinv"),
        pytest.param(dict(num_landmarks=8, pinv_init="original"), id="batch-wide-z0"),
        pytest.param(dict(num_landmarks=8, dtype=torch.float64), id="float64"),
        pytest.param(dict(num_landmarks=8, d=160), id="head-dim-160"),
    ],
)
def test_shapes_the_kernels_do_not_cover_run_the_pytorch_path(options):
    device = _interpreted()
    options = dict(options)
    dtype, d = options.pop("dtype", torch.float32), options.pop("d", 16)
    q, k, v = _inputs(1, 2, 300, d, 16, dtype, device)
    before = LAUNCHES.copy()
    with fused_kernels(True):
        assert not fused.covers(q, v, num_landmarks=options["num_landmarks"],
                                pinv=options.get("pinv", "iterative"),
                                pinv_init=options.get("pinv_init", "per_matrix"))  # fmt: skip
        out = nystrom_attention(q, k, v, **options)
    assert LAUNCHES == before
    ref = nystrom_attention_materialized(*(t.detach().double() for t in (q, k, v)), **options)
    assert rel_err(out, ref) <= 1e-5


def test_module_training_step_equals_the_pytorch_path():
    """The attention module (projections, conv skip, output) through the fused kernels: loss and every
    parameter's gradient (the conv's included) equal the PyTorch path's."""
    _interpreted()
    torch.manual_seed(0)
    layer = NystromAttention(32, heads=2, dim_head=16, num_landmarks=8, conv_kernel_size=5)
    x = torch.randn(2, 37, 32)
    mask = right_pad_mask([37, 30], 37)
    results = []
    for enabled in (True, False):
        layer.zero_grad()
        with fused_kernels(enabled):
            loss = (layer(x, mask=mask) * mask[..., None]).square().mean()
            loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in layer.parameters()]))
    (loss_f, grads_f), (loss_p, grads_p) = results
    assert rel_err(loss_f, loss_p) <= 1e-6
    for g, r in zip(grads_f, grads_p):
        assert rel_err(g, r) <= 1e-4


def test_autocast_runs_in_the_autocast_dtype():
    device = _interpreted()
    q, k, v = _inputs(1, 2, 37, 16, 16, torch.float32, device)
    with torch.autocast(device, dtype=torch.bfloat16), fused_kernels(True):
        out = nystrom_attention(q, k, v, num_landmarks=8)
        p = plan(None, 1, 37, 8, "balanced", q.device)
        direct = fused_attention_op(q, k, v, p.seg, p.bounds, p.counts, p.spans, p.length, None, 0.25, 6)[0]
    assert out.dtype == torch.float32  # the entry point keeps the inputs' dtype under autocast
    assert direct.dtype == torch.bfloat16  # the op alone follows autocast, like SDPA
    ref = nystrom_attention_materialized(*(t.detach().double() for t in (q, k, v)), num_landmarks=8)
    assert rel_err(direct, ref) <= 2e-2


@pytest.mark.parametrize("taps", [None, 5], ids=["no-conv", "conv-5"])
def test_opcheck(taps, device):
    """torch.library's own checks of both ops: schema, fake kernels (shapes and strides: a compiled
    backward once met a dw whose strides the fake kernel did not give), autograd registration."""
    q, k, v = _inputs(1, 2, 21, 16, 16, torch.float32, device)
    p = plan(right_pad_mask([17], 21).to(device), 1, 21, 8, "balanced", q.device)
    w = None if taps is None else torch.randn(2, taps, device=device, requires_grad=True)
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(fused_attention_op, (q, k, v, p.seg, p.bounds, p.counts, p.spans, p.length, w, 0.25, 6), test_utils=checks)
    saved = [t.detach() for t in fused_attention_op(q, k, v, p.seg, p.bounds, p.counts, p.spans, p.length, w, 0.25, 6)]
    grad = torch.randn_like(saved[0])
    args = (grad, *(t.detach() for t in (q, k, v)), p.seg, p.counts, p.spans, p.length, None if w is None else w.detach(), saved, 0.25)
    torch.library.opcheck(fused_attention_backward_op, args, test_utils=("test_schema", "test_faketensor"))


def test_compile_traces_the_op_without_graph_breaks():
    device = _interpreted()
    q, k, v = _inputs(1, 2, 37, 16, 16, torch.float32, device)
    mask = right_pad_mask([30], 37)

    def attend(q, k, v, mask):
        return nystrom_attention(q, k, v, num_landmarks=8, mask=mask)

    with fused_kernels(True):
        eager = attend(q, k, v, mask)
        compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)(q, k, v, mask)
        (g_eager,) = torch.autograd.grad(eager.sum(), q)
        (g_compiled,) = torch.autograd.grad(compiled.sum(), q)
    assert rel_err(compiled, eager) <= 1e-6
    assert rel_err(g_compiled, g_eager) <= 1e-6


def test_fused_kernels_without_the_interpreter_or_a_gpu_raises(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a GPU runs them")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        with fused_kernels(True):
            pass
    with pytest.raises(TypeError, match="bool"):
        with fused_kernels(1):
            pass


# --- the same on CUDA at real sizes -------------------------------------------------------------------


CUDA_ORACLE_CELLS = [  # the half dtypes at the paper's size, the other head dims in bf16 (each new tile size
    # is a Triton compile of ~20-30 s on the GPU's first run); float32 where covers() takes it (its larger
    # tiles spill past the bounds of docs/gpu/kernel_resources.md and run the PyTorch path)
    *(pytest.param(dtype, 64, 64, id=f"{name}-d64-m64") for dtype, name in
      ((torch.bfloat16, "bf16"), (torch.float16, "fp16"))),
    pytest.param(torch.float32, 32, 16, id="fp32-d32-m16"),
    pytest.param(torch.bfloat16, 32, 16, id="bf16-d32-m16"),
    pytest.param(torch.bfloat16, 128, 64, id="bf16-d128-m64"),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, d, m", CUDA_ORACLE_CELLS)
def test_cuda_fused_equals_the_oracle(dtype, d, m):
    n = 1000  # not a multiple of m; the oracle materialises n×m in float64
    _check_against_oracle("cuda", dtype, 2, 4, n, d, d, m, [n, 700], "balanced", True, 65)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, d, m", [(torch.float32, 32, 16), (torch.bfloat16, 64, 64)], ids=["fp32", "bf16"])
def test_cuda_fused_equals_the_pytorch_path_at_4k(dtype, d, m):
    q, k, v = _inputs(2, 8, 4096, d, d, dtype, "cuda")
    mask = right_pad_mask([4096, 3000], 4096).cuda()
    weight = torch.randn(2, 8, 4096, d, device="cuda")
    results = []
    for enabled in (True, False):
        before = LAUNCHES["query_pass"]
        with fused_kernels(enabled):
            out = nystrom_attention(q, k, v, num_landmarks=m, mask=mask)
            results.append((out, _grads(out, (q, k, v), weight)))
        assert LAUNCHES["query_pass"] == before + enabled  # the kernels ran, then the PyTorch path
    (out, got), (ref, want) = results
    out_tol, grad_tol = TOLERANCE[dtype]
    assert rel_err(out, ref) <= out_tol
    for g, r in zip(got, want):
        assert rel_err(g, r) <= grad_tol


@given(
    n=st.integers(1, 70), m=st.integers(1, 24), segments=st.sampled_from(["balanced", "front_padded"]),
    kind=st.sampled_from(["none", "right", "random"]), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_the_plan_matches_the_landmark_assignment(n, m, segments, kind, seed):
    """The closed-form plan gives every token the reference's landmark and count, and each landmark's
    tokens lie in its [start, end) range."""
    g = torch.Generator().manual_seed(seed)
    b = 3
    mask = None
    if kind == "right":
        mask = torch.arange(n)[None] < torch.randint(1, n + 1, (b, 1), generator=g)
    elif kind == "random":
        mask = torch.rand(b, n, generator=g) > 0.5
        mask[:, 0] = True
    p = plan(mask, b, n, m, segments, torch.device("cpu"))
    seg, counts = landmark_assignment(mask, b, n, m, torch.device("cpu"), segments=segments)
    assert torch.equal(p.seg.long(), seg) and torch.equal(p.counts.long(), counts)
    pos = torch.arange(n).expand(b, n)
    for j in range(m):
        mine = seg == j
        start, end = p.bounds[:, j, 0:1], p.bounds[:, j, 1:2]  # (b, 1)
        assert bool(((start <= pos) & (pos < end))[mine].all())


@pytest.mark.parametrize("capability, runs", [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_cuda_calls_take_the_kernels_from_ampere_on(capability, runs, monkeypatch):
    """A GPU older than sm_80 (no bfloat16 tl.dot) runs the PyTorch path instead of failing to compile."""
    from types import SimpleNamespace

    monkeypatch.setattr(fused, "TRITON_INSTALLED", True)
    monkeypatch.setattr(fused, "_capability", lambda device: capability)
    monkeypatch.setattr(fused, "_shared_per_block", lambda device: 163 * 1024)  # an A100's
    q = SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16, shape=(1, 8, 4096, 64))
    v = SimpleNamespace(shape=(1, 8, 4096, 64))
    assert fused.covers(q, v, num_landmarks=64, pinv="iterative", pinv_init="per_matrix") is runs


GPU_BOUND_CELLS = [  # dtype, m, d, dv, the GPU's opt-in shared memory per block (KB), covered
    pytest.param(torch.bfloat16, 64, 64, 64, 227, True, id="bf16-m64-h100"),
    pytest.param(torch.bfloat16, 64, 64, 64, 163, True, id="bf16-m64-a100"),
    pytest.param(torch.bfloat16, 64, 64, 64, 99, False, id="bf16-m64-rtx4090"),  # landmark_backward: 144 KB
    pytest.param(torch.float16, 32, 128, 80, 99, True, id="fp16-m32-d128-rtx4090"),
    pytest.param(torch.float32, 64, 64, 64, 227, False, id="fp32-m64-d64"),  # its backward spills 4+ KB
    pytest.param(torch.float32, 16, 32, 32, 99, True, id="fp32-m16-d32"),
]


@pytest.mark.parametrize("dtype, m, d, dv, shared_kb, covered", GPU_BOUND_CELLS)
def test_shapes_the_gpu_kernels_were_not_compiled_within_bounds_for_run_the_pytorch_path(
    dtype, m, d, dv, shared_kb, covered, monkeypatch
):
    """On CUDA, a call whose tiles spill past the bounds at every warps tried, or need more shared memory
    than the GPU has (docs/gpu/kernel_resources.md), is not covered; the interpreter takes it."""
    from types import SimpleNamespace

    monkeypatch.setattr(fused, "TRITON_INSTALLED", True)
    monkeypatch.setattr(fused, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(fused, "_shared_per_block", lambda device: shared_kb * 1024)
    q = SimpleNamespace(device=torch.device("cuda"), dtype=dtype, shape=(1, 8, 4096, d))
    v = SimpleNamespace(shape=(1, 8, 4096, dv))
    options = dict(num_landmarks=m, pinv="iterative", pinv_init="per_matrix")
    assert fused.covers(q, v, **options) is covered
    with fused_kernels(True):
        assert fused.covers(SimpleNamespace(**{**vars(q), "device": torch.device("cpu")}), v, **options)


@pytest.mark.gpu
def test_cuda_calls_outside_the_compiled_bounds_run_the_pytorch_path():
    q, k, v = _inputs(1, 2, 300, 64, 64, torch.float32, "cuda")  # float32, m = 64: the backward spills
    before = LAUNCHES.copy()
    assert not fused.covers(q, v, num_landmarks=64, pinv="iterative", pinv_init="per_matrix")
    out = nystrom_attention(q, k, v, num_landmarks=64)
    assert LAUNCHES == before
    ref = nystrom_attention_materialized(*(t.detach().double() for t in (q, k, v)), num_landmarks=64)
    assert rel_err(out, ref) <= 1e-5


# --- what an interpreter on one multiprocessor would not show ------------------------------------------


SPLIT_CASES = [  # b, h, n, programs per call, mask kind (real tokens in every split), conv taps
    pytest.param(1, 2, 100, 6, "holes", 5, id="3-splits-holes-conv"),
    pytest.param(2, 1, 112, 14, "nan-right-padded", None, id="7-splits-nan-padding"),
    pytest.param(1, 1, 75, 5, None, 65, id="5-splits-conv-65"),
]


@pytest.mark.parametrize("b, h, n, programs, kind, taps", SPLIT_CASES)
def test_several_splits_equal_the_oracle(b, h, n, programs, kind, taps, launch_grids, device):
    """The passes over n cut into 3-7 splits, as a GPU's multiprocessor count cuts them: the key pass's
    combine of the splits and the backward's split sums, forward and every gradient (16-token blocks)."""
    grids = launch_grids
    mask = None
    if kind == "holes":
        mask = torch.arange(n)[None, :] % 7 != 3  # holes in every split
    elif kind is not None:
        mask = right_pad_mask([n, n - 20], n)
    blocks = {name: {"BN": 16} for name in ("key_pass", "query_pass", "query_backward")}
    with split_programs(programs), tuned(blocks):
        _check_against_oracle(device, torch.float32, b, h, n, 16, 16, 8, None, "balanced",
                              kind == "nan-right-padded", taps, mask=mask)  # fmt: skip
    splits = grids["key_pass"][1]
    assert 3 <= splits <= 7 and splits == -(-programs // (b * h))
    assert grids["query_backward"] == grids["key_backward"] == (b * h, splits)
    assert grids["query_pass"] == grids["query_landmarks"] == (b * h * -(-n // 16),)


@pytest.mark.parametrize("segments", ["balanced", "front_padded"])
def test_a_sample_with_no_real_token_gives_zero_rows_and_finite_gradients(segments, monkeypatch, device):
    """With the host's value checks off (as on a GPU, where they would stall it), a sample that is all
    padding gives rows of 0 and gradients of 0 under every segments rule, and changes no other sample."""
    monkeypatch.setattr(checks, "value_checks_enabled", lambda t: False)
    n = 37
    mask = torch.zeros(2, n, dtype=torch.bool, device=device)
    mask[0, :30] = True
    q, k, v = _inputs(2, 2, n, 16, 16, torch.float32, device, nan_mask=mask)
    conv = (torch.randn(2, 1, 5, 1, device=device) / 5).requires_grad_()
    with fused_kernels(True):
        out = nystrom_attention(q, k, v, num_landmarks=8, mask=mask, segments=segments, conv_weight=conv)
        alone = nystrom_attention(*(t[:1] for t in (q, k, v)), num_landmarks=8, mask=mask[:1],
                                  segments=segments, conv_weight=conv)  # fmt: skip
    assert torch.isfinite(out).all() and out[1].abs().max() == 0
    assert rel_err(out[:1] * mask[:1, None, :, None], alone * mask[:1, None, :, None]) <= 1e-6
    weight = torch.randn(out.shape, device=device) * mask[:, None, :, None]
    grads = _grads(out, (q, k, v, conv), weight)
    for name, g in zip("qkvw", grads):
        assert torch.isfinite(g).all(), name
    for g in grads[:3]:
        assert g[1].abs().max() == 0


def _recorded_launches(monkeypatch, b, h, n, taps=None, mask=None):
    """The kernels, grids and ATen op counts of one forward and backward on meta tensors, launches recorded
    instead of run (the op's real Python: the wrapper, plan, allocations, launch arguments)."""
    launched: list[tuple[str, tuple]] = []
    for module in (fused_forward, fused_backward):
        monkeypatch.setattr(module, "launch", lambda kernel, grid, *a, **k: launched.append((kernel.__name__, grid)))
    q, k, v = (torch.empty(b, h, n, 64, device="meta") for _ in range(3))
    w = None if taps is None else torch.empty(h, taps, device="meta")
    p = plan(mask, b, n, 64, "balanced", q.device)
    with counting() as forward_count:  # the ATen ops that launch work (views and allocations do not)
        saved = fused_forward.forward(q, k, v, p.seg, p.bounds, p.counts, p.spans, p.length, w, 0.125, 6)
    forward, launched[:] = list(launched), []
    with counting() as backward_count:
        fused_backward.backward(torch.empty_like(saved.out), q, k, v, p.seg, p.counts, p.spans, p.length, w, saved, 0.125)
    return forward, list(launched), summary(forward_count), summary(backward_count)


def test_no_launch_grid_passes_cudas_limits(monkeypatch):
    """n = 5 000 000: the token blocks (78 125 a head) share grid axis 0 with the heads (2³¹ − 1 programs);
    axes 1 and 2 (65 535 at most) hold only the splits."""
    b, h, n = 2, 8, 5_000_000
    forward, backward, _, _ = _recorded_launches(monkeypatch, b, h, n)
    for name, grid in forward + backward:
        assert grid[0] <= 2**31 - 1 and all(axis <= 65_535 for axis in grid[1:]), (name, grid)
    grids = dict(forward + backward)
    assert grids["query_pass"] == grids["query_landmarks"] == (b * h * 78_125,)


def test_nystrom_fused_0_in_the_environment_turns_the_kernels_off(monkeypatch):
    """``NYSTROM_FUSED=0``: read when the op is first asked, no code change; a fused_kernels() block still
    decides inside it; a value other than 0/1 raises instead of silently keeping the kernels on."""
    q = v = torch.empty(1, 2, 64, 16, device="meta")
    options = dict(num_landmarks=8, pinv="iterative", pinv_init="per_matrix")
    monkeypatch.delitem(fused._state, "environment", raising=False)
    monkeypatch.setenv("NYSTROM_FUSED", "0")
    assert not fused.covers(q, v, **options)
    monkeypatch.setenv("NYSTROM_FUSED", "1")  # read once: the first answer stands
    assert not fused.covers(q, v, **options)
    monkeypatch.delitem(fused._state, "environment")
    assert fused.covers(q, v, **options)
    monkeypatch.delitem(fused._state, "environment")
    monkeypatch.setenv("NYSTROM_FUSED", "off")
    with pytest.raises(ValueError, match="NYSTROM_FUSED must be 0"):
        fused.covers(q, v, **options)
    monkeypatch.delitem(fused._state, "environment", raising=False)


def test_a_failed_launch_says_how_to_turn_the_kernels_off():
    class Kernel:
        __name__ = "query_pass"

        def __getitem__(self, grid):
            def run(*args, **meta):
                raise MemoryError("out of resources: shared memory, required: 200000, hardware limit: 101376")

            return run

    with pytest.raises(RuntimeError, match="query_pass failed .*NYSTROM_FUSED=0.*fused_kernels\\(False\\)"):
        fused_launch.launch(Kernel(), (1,))


def test_tuning_overrides_and_split_targets_are_checked():
    with pytest.raises(ValueError, match="not a kernel"):
        with tuned({"landmark_pinv": {"BN": 32}}):  # a per-head kernel has no token block
            pass
    with pytest.raises(ValueError, match="not a kernel"):
        with tuned({"query_pas": {"num_warps": 8}}):
            pass
    with pytest.raises(ValueError, match="positive int"):
        with split_programs(0):
            pass
    with pytest.raises(ValueError, match="not a kernel"):
        with tuned({"landmark_pinv": {"PINV_DOT": "tf32"}}):  # too coarse for the pinv
            pass
    with tuned({"query_pass": {"BN": 32, "num_warps": 8}}):
        assert fused_launch.token_block("query_pass") == 32 and fused_launch.token_block("key_pass") == 64
    assert fused_launch.token_block("query_pass") == 64
    with tuned({"landmark_pinv": {"CONCURRENT": 1, "PINV_DOT": "tf32x3"}}):  # a side stream on CUDA only
        assert fused_launch.side_stream(torch.device("cpu"), "landmark_pinv") is None
        assert fused_launch.side_stream(torch.device("meta"), "landmark_pinv") is None


def test_tuned_launches_take_the_override(monkeypatch):
    """What the GPU sweep sets reaches the kernel's launch: warps, stages and the per-head precision
    (the token block goes to the launcher, the side stream to the forward)."""
    seen = {}

    class Kernel:
        __name__ = "landmark_pinv"

        def __getitem__(self, grid):
            return lambda *args, **meta: seen.update(meta)

    with tuned({"landmark_pinv": {"num_warps": 16, "PINV_DOT": "bf16x6", "CONCURRENT": 1}}):
        fused_launch.launch(Kernel(), (1,), BM=64, PINV_DOT="ieee", num_warps=8)
    assert seen == {"BM": 64, "PINV_DOT": "bf16x6", "num_warps": 16}


def test_inputs_on_two_devices_raise_naming_both():
    with pytest.raises(ValueError, match="q is on cpu but k is on meta"):
        fused_launch.check_devices(q=torch.empty(1), k=torch.empty(1, device="meta"), v=None)
    assert fused_launch.check_devices(q=torch.empty(1), k=None, v=torch.empty(2)) == torch.device("cpu")


def test_cuda_launches_run_with_the_inputs_device_current(monkeypatch):
    """Triton launches on the current CUDA device and stream: the op makes q's device current around its
    launches, forward and backward (the two-GPU case itself runs under the gpu marker)."""
    entered = []

    @contextlib.contextmanager
    def device(where):
        entered.append(where)
        yield

    monkeypatch.setattr(torch.cuda, "device", device)
    with fused_launch.on_device(torch.device("cuda", 1)):
        pass
    with fused_launch.on_device(torch.device("cpu")):  # nothing to make current
        pass
    assert entered == [torch.device("cuda", 1)]
    seen = []
    real = fused_op.on_device

    def spy(where):
        seen.append(where)
        return real(where)

    monkeypatch.setattr(fused_op, "on_device", spy)
    device_name = _interpreted()
    q, k, v = _inputs(1, 2, 21, 16, 16, torch.float32, device_name)
    with fused_kernels(True):
        nystrom_attention(q, k, v, num_landmarks=8).sum().backward()
    assert seen == [q.device, q.device]


@pytest.mark.gpu
def test_cuda_inputs_on_the_second_gpu_with_the_first_current():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torch.cuda.set_device(0)
    q, k, v = (torch.randn(2, 4, 1000, 64, device="cuda:1", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))  # fmt: skip
    out = nystrom_attention(q, k, v, num_landmarks=64)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    with torch.cuda.device(1):
        ref = nystrom_attention(q, k, v, num_landmarks=64)
        want = torch.autograd.grad(ref.float().square().sum(), (q, k, v))
    assert torch.equal(out, ref)
    for g, r in zip(grads, want):
        assert torch.equal(g, r)
