"""Half precision: our fused path vs the same formula run plainly in that dtype, both against float64."""

import pytest
import torch

from nystrom import NystromAttention
from nystrom.functional import nystrom_attention
from nystrom.ops.pinv.naive import reference_pinv

from oracle import nystrom_oracle, rel_err


def plain_nystrom(q, k, v, m, iters=6):
    """The paper's formula with every op in the inputs' dtype (what the public codes run under .half())."""
    b, h, n, d = q.shape
    s = d**-0.5
    ql = q.reshape(b, h, m, n // m, d).mean(3)
    kl = k.reshape(b, h, m, n // m, d).mean(3)
    f = torch.softmax(q @ kl.mT * s, -1)
    a = torch.softmax(ql @ kl.mT * s, -1)
    bm = torch.softmax(ql @ k.mT * s, -1)
    z = reference_pinv(a, iters, per_matrix=True)  # the op's reference iterations, here in the inputs' dtype
    return f @ (z @ (bm @ v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_error_at_most_twice_plain(dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 32) for _ in range(3))
    q, k, v = (t.to(dtype).double() for t in (q, k, v))  # the oracle sees exactly the rounded inputs
    ref = nystrom_oracle(q, k, v, 32, pinv="iterative")
    ours = nystrom_attention(*(t.to(dtype) for t in (q, k, v)), num_landmarks=32)
    plain = plain_nystrom(*(t.to(dtype) for t in (q, k, v)), 32)
    assert ours.dtype == dtype
    e_ours, e_plain = rel_err(ours, ref), rel_err(plain, ref)
    assert torch.isfinite(ours).all()
    assert e_ours <= 2 * e_plain, (e_ours, e_plain)
    assert e_ours < 0.05


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_module_after_half_cast_runs_and_is_close(dtype):
    mod = NystromAttention(64, heads=4, dim_head=16, num_landmarks=16, conv_kernel_size=5)
    x = torch.randn(2, 100, 64)
    ref = mod(x)
    out = mod.to(dtype)(x.to(dtype))
    assert out.dtype == dtype
    assert rel_err(out, ref) < 0.05


def test_module_under_autocast_bf16_forward_and_backward():
    mod = NystromAttention(64, heads=4, dim_head=16, num_landmarks=16)
    x = torch.randn(2, 100, 64, requires_grad=True)
    mask = torch.arange(100)[None] < torch.tensor([[100], [70]])
    ref = mod(x, mask=mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mod(x, mask=mask)
    assert out.dtype == torch.bfloat16
    real = mask[..., None].expand_as(ref)
    assert rel_err(out[real], ref[real]) < 0.05
    out.float().square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert mod.qkv.weight.grad is not None and torch.isfinite(mod.qkv.weight.grad).all()
