"""The threaded CPU kernels: every grad mode, batch 0 (regressions of the threaded kernels), and training
gradients through them (padding inert, batch independence).

The kernels switch on at ``SHORT_MIN_N``/``LONG_MIN_N`` tokens (16384; ``TRAIN_MIN_N`` when a gradient is
recorded); the tests lower all three so that
tiny inputs take the threaded chunked path, with 2 intra-op threads so that the worker pool runs.
"""

import pytest
import torch

from nystrom.attention import NystromAttention
from nystrom.functional import nystrom_attention
from nystrom.ops.nystrom import cpu_kernels as kernels


@pytest.fixture
def threaded_kernels(monkeypatch):
    """Chunked kernels from 1 token on, several chunks and ranges, 2 threads (restored afterwards)."""
    monkeypatch.setattr(kernels, "SHORT_MIN_N", 1)
    monkeypatch.setattr(kernels, "LONG_MIN_N", 1)
    monkeypatch.setattr(kernels, "TRAIN_MIN_N", 1)
    monkeypatch.setattr(kernels, "CHUNK_ROWS", 16)
    monkeypatch.setattr(kernels, "CHUNK_KEYS", 16)
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(prev)


@pytest.mark.parametrize("mode", [torch.inference_mode, torch.no_grad])
def test_kernels_run_under_inference_mode_and_no_grad(threaded_kernels, mode):
    q, k, v = (torch.randn(2, 3, 80, 8) for _ in range(3))
    ref = nystrom_attention(q, k, v, num_landmarks=8)  # grad mode on: the reference
    with mode():
        out = nystrom_attention(q, k, v, num_landmarks=8)
    assert torch.equal(out, ref)
    mod = NystromAttention(24, heads=3, dim_head=8, num_landmarks=8, conv_kernel_size=5).eval()
    x = torch.randn(2, 80, 24)
    mask = torch.ones(2, 80, dtype=torch.bool)
    mask[1, 50:] = False
    ref = mod(x, mask)
    with mode():
        out = mod(x, mask)
    assert torch.equal(out, ref)


def test_inference_mode_at_the_real_switch_length():
    """n = 16384 with the production thresholds and 2 threads (tiny d keeps it fast)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q = torch.randn(1, 2, kernels.SHORT_MIN_N, 4)
        with torch.inference_mode():
            out = nystrom_attention(q, q, q, num_landmarks=16)
        assert out.shape == q.shape and bool(torch.isfinite(out).all())
    finally:
        torch.set_num_threads(prev)


def test_batch_zero_gives_empty_output_and_gradients(threaded_kernels):
    q, k, v = (torch.randn(0, 3, 80, 8, requires_grad=True) for _ in range(3))
    out = nystrom_attention(q, k, v, num_landmarks=8)
    assert out.shape == (0, 3, 80, 8)
    out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (q, k, v))
    mod = NystromAttention(24, heads=3, dim_head=8, num_landmarks=8, conv_kernel_size=5)
    x = torch.randn(0, 80, 24, requires_grad=True)
    y = mod(x, torch.ones(0, 80, dtype=torch.bool))
    assert y.shape == (0, 80, 24)
    y.sum().backward()
    assert x.grad.shape == x.shape and mod.qkv.weight.grad is not None
    assert float(mod.qkv.weight.grad.abs().sum()) == 0.0  # no sample, no gradient


@pytest.mark.parametrize("conv", [3, None])
def test_kernel_path_module_gradients_padding_inert_and_batch_independent(threaded_kernels, conv):
    torch.manual_seed(1)
    mod = NystromAttention(12, heads=2, dim_head=6, num_landmarks=5, conv_kernel_size=conv).double()
    x = torch.randn(2, 33, 12, dtype=torch.float64)
    mask = torch.ones(2, 33, dtype=torch.bool)
    mask[1, 20:] = False
    g = torch.randn(2, 33, 12, dtype=torch.float64) * mask[..., None]  # real rows only

    def grads(x, mask, g):
        x = x.clone().requires_grad_()
        mod.zero_grad()
        mod(x, mask).backward(g)
        return x.grad, mod.qkv.weight.grad.clone()

    dx, dw = grads(x, mask, g)
    assert float(dx[1, 20:].abs().max()) == 0.0  # padded tokens get exactly zero gradient
    x2 = x.clone()
    x2[1, 20:] = 1e3 * torch.randn(13, 12, dtype=torch.float64)  # any padding values
    dx2, dw2 = grads(x2, mask, g)
    torch.testing.assert_close(dx2, dx, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw2, dw, rtol=1e-10, atol=1e-12)
    dx_alone, _ = grads(x[1:], mask[1:], g[1:])  # sample 1 alone: same input gradient
    torch.testing.assert_close(dx_alone[0], dx[1], rtol=1e-10, atol=1e-12)


def test_training_switch_point_is_separate_from_inference(monkeypatch):
    """With a gradient to record the CPU dispatch uses ``TRAIN_MIN_N``; without one, ``*_MIN_N``."""
    monkeypatch.setattr(kernels, "SHORT_MIN_N", 1)
    monkeypatch.setattr(kernels, "LONG_MIN_N", 1)
    monkeypatch.setattr(kernels, "TRAIN_MIN_N", 10**9)
    q = torch.randn(1, 2, 40, 8)
    kl = torch.randn(1, 2, 4, 8)
    fused = kernels.short_key_attention(q, kl, kl, scale=0.3)
    assert fused.is_contiguous() is False  # a (b, h, n, d) view of the fused kernel's (b, n, h, d) buffer
    q.requires_grad_()
    out = kernels.short_key_attention(q, kl, kl, scale=0.3)
    assert out.grad_fn is not None and "ShortKey" not in type(out.grad_fn).__name__
    monkeypatch.setattr(kernels, "TRAIN_MIN_N", 1)
    out = kernels.short_key_attention(q, kl, kl, scale=0.3)
    assert "ShortKey" in type(out.grad_fn).__name__
    torch.testing.assert_close(out.detach(), fused, rtol=1e-5, atol=1e-6)
