"""The ``scale`` option of NystromAttention and SoftmaxAttention (the logit scale s, None = 1/√d): it reaches
every softmax, Nyström with m = n and the exact pinv still equals softmax at that scale, and bad values raise."""

from __future__ import annotations

import math

import pytest
import torch

from nystrom.attention import NystromAttention, SoftmaxAttention
from nystrom.ops.softmax import softmax_attention
from nystrom_lab import attention_spec


def _copy(dst, src):
    dst.load_state_dict(src.state_dict(), strict=False)
    return dst


@pytest.mark.parametrize("scale", [None, 0.05, 0.4])
def test_nystrom_at_m_equal_n_is_softmax_at_the_same_scale(scale):
    torch.manual_seed(0)
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    soft = SoftmaxAttention(32, heads=4, dim_head=8, scale=scale).double().eval()
    nys = _copy(NystromAttention(32, heads=4, dim_head=8, num_landmarks=16, pinv="exact", conv_kernel_size=None,
                                 scale=scale).double().eval(), soft)  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(nys(x), soft(x), rtol=0, atol=1e-9)


def test_the_scale_changes_the_output_as_the_formula_says():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8, dtype=torch.float64) for _ in range(3))
    want = torch.softmax(q @ k.mT * 0.3, -1) @ v
    torch.testing.assert_close(softmax_attention(q, k, v, scale=0.3), want)
    base = SoftmaxAttention(16, heads=2, dim_head=8).double().eval()
    sharp = _copy(SoftmaxAttention(16, heads=2, dim_head=8, scale=2 / math.sqrt(8)).double().eval(), base)
    x = torch.randn(1, 10, 16, dtype=torch.float64)
    with torch.no_grad():
        assert not torch.allclose(base(x), sharp(x))
    assert "scale=" in repr(sharp) and "scale=" not in repr(base)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "0.1"])
def test_bad_scales_raise(bad):
    with pytest.raises(ValueError, match="scale must be None"):
        NystromAttention(16, heads=2, dim_head=8, scale=bad)
    with pytest.raises(ValueError, match="scale must be None"):
        SoftmaxAttention(16, heads=2, dim_head=8, scale=bad)


def test_spec_grammar():
    assert attention_spec.parse("nystrom-32,scale=0.1667") == {
        "name": "nystrom",
        "num_landmarks": 32,
        "scale": 0.1667,
    }
    assert attention_spec.parse("softmax,scale=none") == {"name": "softmax", "scale": None}
    for bad in ("softmax,scale=0", "softmax,scale=-1", "softmax,scale=nan", "softmax,scale=x"):
        with pytest.raises(ValueError, match="scale must be a number > 0 or none"):
            attention_spec.parse(bad)
