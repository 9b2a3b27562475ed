"""Every implementation of an op against the op's one plain reference (its ``naive.py``), forward and
gradients, in float64: Nyström attention's CPU path (its threaded kernels and the SDPA it takes for short
inputs), accelerator path and traceable path against ``nystrom_attention_materialized``, and the fused
pseudo-inverse op against ``reference_pinv``, the conv skip's three paths against ``reference_conv_skip``.
Each implementation is reached through the op's dispatch."""

import contextlib

import pytest
import torch

import nystrom.ops.nystrom.dispatch as dispatch
from nystrom.ops.nystrom import cpu_kernels, nystrom_attention
from nystrom.ops.nystrom.naive import nystrom_attention_materialized
from nystrom.ops.pinv import iterative_pinv
from nystrom.ops.pinv.naive import reference_pinv
from nystrom.utils.device import force_accelerator_path

from oracle import rel_err, right_pad_mask

IMPLEMENTATIONS = ("cpu-kernels", "cpu-sdpa", "accelerator", "traceable")


def _reach(implementation: str, monkeypatch) -> contextlib.AbstractContextManager:
    """Set the dispatch up so that ``nystrom_attention`` takes ``implementation``."""
    if implementation == "cpu-kernels":  # the blocked, threaded kernels at any n, in chunks (two_threads)
        for name, value in (("SHORT_MIN_N", 1), ("LONG_MIN_N", 1), ("TRAIN_MIN_N", 1), ("CHUNK_ROWS", 16),
                            ("CHUNK_KEYS", 8)):  # fmt: skip
            monkeypatch.setattr(cpu_kernels, name, value)
    if implementation == "traceable":
        monkeypatch.setattr(dispatch, "_eager", lambda: False)
    return force_accelerator_path() if implementation == "accelerator" else contextlib.nullcontext()


@pytest.mark.parametrize("pinv", ["iterative", "exact"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_nystrom_implementation_equals_the_reference(implementation, padded, pinv, monkeypatch, two_threads):
    b, h, n, d, m = 2, 3, 50, 8, 8
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = right_pad_mask([n, 6], n) if padded else None  # the second sample: fewer real tokens than m
    real = torch.ones(b, n, dtype=torch.bool) if mask is None else mask
    go = torch.randn(b, h, n, d, dtype=torch.float64) * real[:, None, :, None]  # padded rows: unspecified
    options = {"num_landmarks": m, "mask": mask, "pinv": pinv}
    want = nystrom_attention_materialized(q, k, v, **options)
    want_grads = torch.autograd.grad(want, (q, k, v), go)
    with _reach(implementation, monkeypatch):
        got = nystrom_attention(q, k, v, **options)
        got_grads = torch.autograd.grad(got, (q, k, v), go)
    rows = real[:, None, :, None].expand_as(got)
    assert rel_err(got[rows], want[rows]) <= 1e-12
    for g, w in zip(got_grads, want_grads):
        assert rel_err(g, w) <= 1e-10


@pytest.mark.parametrize("init", ["per_matrix", "original"])
def test_fused_pinv_op_equals_the_reference(init):
    a = torch.softmax(torch.randn(2, 3, 12, 12, dtype=torch.float64) * 2, -1).requires_grad_()
    g = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    want = reference_pinv(a, 6, init == "per_matrix")
    with force_accelerator_path():  # the dispatch takes nystrom::iterative_pinv
        got = iterative_pinv(a, 6, init)
    assert torch.equal(got, want)  # the same arithmetic
    assert rel_err(torch.autograd.grad(got, a, g)[0], torch.autograd.grad(want, a, g)[0]) <= 1e-12


CONV_PATHS = ("cpu", "accelerator", "traced")


@pytest.mark.parametrize("path", CONV_PATHS)
def test_conv_skip_equals_the_reference(path, monkeypatch):
    """The conv skip's three implementations (banded GEMMs, one conv2d, shifted multiply-adds) against
    ``reference_conv_skip``, forward and both gradients, in float64."""
    from nystrom.ops.conv import banded, conv_skip
    from nystrom.ops.conv.naive import reference_conv_skip

    if path == "traced":
        monkeypatch.setattr(banded.torch.compiler, "is_compiling", lambda: True)
    v = torch.randn(2, 3, 40, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 1, 7, 1, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 3, 40, 8, dtype=torch.float64)
    with force_accelerator_path() if path == "accelerator" else contextlib.nullcontext():
        assert banded.conv_path(v) == path
        out = conv_skip(v, w)
    ref = reference_conv_skip(v, w)
    assert rel_err(out, ref) <= 1e-12
    for got, want in zip(torch.autograd.grad((out * g).sum(), (v, w)), torch.autograd.grad((ref * g).sum(), (v, w))):
        assert rel_err(got, want) <= 1e-12
