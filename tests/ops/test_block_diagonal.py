"""Block-diagonal softmax attention (``SoftmaxAttention(block_size=w)``): each block of w tokens attends to
itself only, so a long model of copied positions computes its source on every block; padding is exact."""

from __future__ import annotations

import pytest
import torch

from nystrom.attention import SoftmaxAttention
from nystrom.model import NystromformerConfig, NystromformerModel
from nystrom.ops.softmax import softmax_attention
from nystrom.ops.softmax.block_diagonal import block_diagonal_attention

f64 = dict(dtype=torch.float64)


@pytest.mark.parametrize(("n", "w"), [(12, 4), (10, 4), (3, 8), (16, 16)])
def test_equals_softmax_on_each_block(n, w):
    q, k, v = (torch.randn(2, 3, n, 5, **f64) for _ in range(3))
    out = block_diagonal_attention(q, k, v, block_size=w)
    for lo in range(0, n, w):
        hi = min(lo + w, n)
        want = softmax_attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi])
        torch.testing.assert_close(out[:, :, lo:hi], want, rtol=0, atol=1e-12)


def test_padding_any_value_changes_no_real_output_and_empty_blocks_give_zeros():
    q, k, v = (torch.randn(2, 2, 12, 4, **f64) for _ in range(3))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 5:] = False  # block 1 half real, block 2 all padding
    ref = block_diagonal_attention(q, k, v, block_size=4, mask=mask)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    for t in (q2, k2, v2):
        t[1, :, 5:] = float("nan")
    out = block_diagonal_attention(q2, k2, v2, block_size=4, mask=mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(
        out[mask[:, None, :, None].expand_as(out)], ref[mask[:, None, :, None].expand_as(ref)]
    )
    want = softmax_attention(q[1:, :, 4:5], k[1:, :, 4:5], v[1:, :, 4:5])
    torch.testing.assert_close(out[1:, :, 4:5], want, rtol=0, atol=1e-12)
    assert not out[1, :, 8:].any()


def test_gradients_are_finite_and_blocked():
    q, k, v = (torch.randn(1, 2, 8, 4, **f64, requires_grad=True) for _ in range(3))
    block_diagonal_attention(q, k, v, block_size=4)[:, :, :4].sum().backward()
    assert not k.grad[:, :, 4:].any() and not v.grad[:, :, 4:].any()  # block 0 never reads block 1
    torch.autograd.gradcheck(lambda a, b, c: block_diagonal_attention(a, b, c, block_size=3), (q, k, v))


def test_module_option_and_a_copied_long_model_runs_its_source_per_block():
    torch.manual_seed(0)
    short = NystromformerConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=24, max_position_embeddings=8, dropout=0.0, attention="softmax")  # fmt: skip
    source = NystromformerModel(short).eval()
    long = NystromformerModel(short.replace(attention={"name": "softmax", "block_size": 8})).eval()
    long.load_state_dict(source.state_dict())
    long.resize_position_embeddings(24)  # copied rows
    assert "block_size=8" in repr(long.encoder.layers[0].attention)
    ids = torch.randint(2, 40, (2, 24))
    with torch.no_grad():
        out = long(ids).last_hidden_state
        for lo in (0, 8, 16):
            torch.testing.assert_close(out[:, lo : lo + 8], source(ids[:, lo : lo + 8]).last_hidden_state)


def test_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        SoftmaxAttention(16, heads=2, dim_head=8, block_size=0)
