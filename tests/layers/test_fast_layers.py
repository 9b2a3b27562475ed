"""The banded-GEMM depthwise conv, the fast dropout, trimmed LRA batches and length-sorted evaluation.

Legend: b batch, h heads, n tokens, d head dim, K kernel length.
"""

import pytest
import torch
from torch import nn

from nystrom.layers.dropout import Dropout, dropout
from nystrom.ops.conv import banded as conv
from nystrom.ops.conv import depthwise_seq_conv, depthwise_seq_conv_add_


@pytest.mark.parametrize(
    ("b", "h", "n", "d", "k", "c"),
    [
        (2, 3, 37, 5, 7, 4),
        (1, 2, 5, 3, 9, 4),
        (2, 2, 64, 4, 35, 64),
        (1, 1, 3, 2, 1, 2),
        (1, 2, 130, 3, 33, 64),
    ],
)
def test_conv_equals_depthwise_conv2d_values_and_gradients(b, h, n, d, k, c):
    torch.manual_seed(0)
    x = torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True)
    ref = nn.Conv2d(h, h, (k, 1), padding=(k // 2, 0), groups=h, bias=False).double()
    w = ref.weight.detach().clone().requires_grad_()  # (h, 1, K, 1)
    y, yr = depthwise_seq_conv(x, w, block_rows=c), ref(x)
    assert y.shape == (b, h, n, d)
    torch.testing.assert_close(y, yr, rtol=0, atol=1e-12)
    g = torch.randn_like(y)
    gx, gw = torch.autograd.grad((y * g).sum(), (x, w))
    rx, rw = torch.autograd.grad((yr * g).sum(), (x, ref.weight))
    torch.testing.assert_close(gx, rx, rtol=0, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=0, atol=1e-11)


@pytest.mark.parametrize("group_bytes", [1, 3 * 2 * 40 * 4 * 8])  # one head per group; 3 of 5 heads, then 2
def test_conv_in_head_groups_equals_one_product(monkeypatch, group_bytes):
    torch.manual_seed(3)
    x = torch.randn(2, 5, 40, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 5, 40, 4, dtype=torch.float64)
    y = depthwise_seq_conv(x, w, block_rows=8)  # 5 heads x 2.5 KB: one group at the default 32 MiB
    ref = (y.detach(), *torch.autograd.grad((y * g).sum(), (x, w)))
    monkeypatch.setattr(conv, "GROUP_BYTES", group_bytes)
    assert len(conv._head_groups(x)) == (5 if group_bytes == 1 else 2)
    y = depthwise_seq_conv(x, w, block_rows=8)
    got = (y.detach(), *torch.autograd.grad((y * g).sum(), (x, w)))
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("n", "c", "group_bytes"), [(37, 4, 32 << 20), (64, 64, 32 << 20), (40, 8, 1)])
def test_conv_added_in_place_equals_conv_plus_out(monkeypatch, n, c, group_bytes):
    """The inference path (attention output += conv skip): ragged last block, head groups, a strided
    (heads-interleaved) out, as the attention kernels return it."""
    torch.manual_seed(4)
    monkeypatch.setattr(conv, "GROUP_BYTES", group_bytes)
    x = torch.randn(2, 3, n, 4, dtype=torch.float64)
    w = torch.randn(3, 1, 7, 1, dtype=torch.float64)
    out = torch.randn(2, n, 3, 4, dtype=torch.float64).permute(0, 2, 1, 3)  # (b, h, n, d) view
    want = out + depthwise_seq_conv(x, w, block_rows=c)
    with torch.no_grad():
        got = depthwise_seq_conv_add_(out, x, w, block_rows=c)
    assert got is out
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_conv_added_in_place_refuses_autograd_and_mismatched_out():
    x = torch.randn(1, 2, 9, 3, requires_grad=True)
    w = torch.randn(2, 5)
    with pytest.raises(RuntimeError, match="for inference"):
        depthwise_seq_conv_add_(torch.zeros(1, 2, 9, 3), x, w)
    with torch.no_grad(), pytest.raises(ValueError, match="out must match x"):
        depthwise_seq_conv_add_(torch.zeros(1, 2, 9, 3, dtype=torch.float64), x, w)


def test_conv_gradcheck_and_strided_input():
    torch.manual_seed(1)
    x = torch.randn(2, 7, 3, 2, dtype=torch.float64).permute(0, 2, 1, 3).requires_grad_()  # (2, 3, 7, 2) view
    w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, ww: depthwise_seq_conv(a, ww, block_rows=4), (x, w))


def test_conv_half_precision_and_bad_weights():
    torch.manual_seed(2)
    x = torch.randn(1, 2, 50, 8)
    w = torch.randn(2, 1, 9, 1)
    ref = depthwise_seq_conv(x.double(), w.double())
    out = depthwise_seq_conv(x.bfloat16(), w)
    assert out.dtype == torch.bfloat16
    assert (out.double() - ref).norm() / ref.norm() < 2e-2
    with pytest.raises(ValueError, match="K odd"):
        depthwise_seq_conv(x, torch.randn(2, 4))
    with pytest.raises(ValueError, match="heads=2"):
        depthwise_seq_conv(x, torch.randn(3, 5))


def test_dropout_keep_rate_scale_and_gradient():
    torch.manual_seed(3)
    x = torch.ones(400, 1000, requires_grad=True)
    y = dropout(x, 0.1, True)
    kept = y != 0
    assert abs(kept.double().mean().item() - 0.9) < 3e-3  # 4e5 draws: sd ≈ 5e-4
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.9))
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, y.detach())  # the gradient uses the same mask and scale
    torch.manual_seed(3)
    torch.testing.assert_close(dropout(x, 0.1, True), y)  # seeded: reproducible
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    assert not bool(dropout(x, 1.0, True).any())
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        dropout(x, 1.5, True)
    with pytest.raises(ValueError, match="inplace"):
        Dropout(0.1, inplace=True)
    mod = Dropout(0.25).eval()
    assert mod(x) is x and isinstance(mod, nn.Dropout)


def test_large_buffers_are_hinted_to_huge_pages():
    import sys

    from nystrom.utils.memory import HUGE_MIN_BYTES, empty

    like = torch.zeros(1, dtype=torch.float64)
    small = empty(3, 4, like=like)
    assert small.shape == (3, 4) and small.dtype == torch.float64
    big = empty(HUGE_MIN_BYTES // 4 + 1024, like=torch.zeros(1))
    assert big.shape == (HUGE_MIN_BYTES // 4 + 1024,) and big.dtype == torch.float32
    if not sys.platform.startswith("linux"):
        return
    ptr = big.data_ptr() + big.nbytes // 2
    flags = None
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= ptr < hi
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
                break
    assert flags is not None and "hg" in flags  # MADV_HUGEPAGE recorded on the buffer's mapping


def test_dropout_saves_no_mask_and_replays_its_draw_in_the_backward():
    torch.manual_seed(5)
    x = torch.randn(300, 200, requires_grad=True)
    y = dropout(x, 0.3, True)
    assert all(t is None for t in y.grad_fn.saved_tensors)  # only the generator state is kept
    torch.rand(1000)  # draws between forward and backward must not change the replayed mask
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(g, (y.detach() != 0).float() / 0.7)
    torch.manual_seed(5)
    after = torch.rand(3)
    torch.manual_seed(5)
    dropout(x, 0.3, True)
    assert not torch.equal(torch.rand(3), after)  # the forward advanced the global generator once, as before
