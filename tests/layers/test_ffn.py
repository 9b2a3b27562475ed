"""The blocked feed-forward (layers/ffn.py) and the model's blocked inference FFN against autograd's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nystrom.layers import ffn
from nystrom.layers.ffn import feed_forward


def _reference(x, w1, b1, w2, b2, act):
    h = F.linear(x, w1, b1)
    a = F.relu(h) if act == "relu" else F.gelu(h, approximate="tanh" if act == "gelu_new" else "none")
    return F.linear(a, w2, b2)


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("block_rows", [1, 4, 1000])
def test_values_and_gradients_match_autograd_in_float64(monkeypatch, act, block_rows):
    e, f = 6, 10
    monkeypatch.setattr(ffn, "BLOCK_BYTES", 8 * f * block_rows)
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 7, e, generator=g, dtype=torch.float64), torch.randn(f, e, generator=g, dtype=torch.float64),
            torch.randn(f, generator=g, dtype=torch.float64), torch.randn(e, f, generator=g, dtype=torch.float64),
            torch.randn(e, generator=g, dtype=torch.float64)]  # fmt: skip
    args = [a.requires_grad_() for a in args]
    y = feed_forward(*args, activation=act)
    ref = _reference(*args, act)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    for a, r in zip(torch.autograd.grad(y, args, dy), torch.autograd.grad(ref, args, dy)):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10)


def test_no_bias_and_bfloat16_autocast():
    torch.manual_seed(1)
    x = torch.randn(3, 5, 8, requires_grad=True)
    w1, w2 = torch.randn(16, 8, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = feed_forward(x, w1, None, w2, None)
        ref = _reference(x, w1, None, w2, None, "gelu")
    assert y.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(y, ref)  # the same bf16 products
    got = torch.autograd.grad(y.float().square().sum(), (x, w1, w2))
    want = torch.autograd.grad(ref.float().square().sum(), (x, w1, w2))
    for a, r in zip(got, want):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, r, rtol=0.05, atol=0.05 * float(r.abs().max()))


def test_bad_activation_and_shapes_raise():
    x, w1, w2 = torch.randn(2, 4), torch.randn(8, 4), torch.randn(4, 8)
    with pytest.raises(ValueError, match="activation must be one of"):
        feed_forward(x, w1, None, w2, None, activation="swish")
    with pytest.raises(ValueError, match="do not chain"):
        feed_forward(x, w1, None, torch.randn(4, 7), None)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_model_paths_agree_training_blocked_inference_and_plain(monkeypatch, norm_position):
    """The encoder gives the same output through the training path (feed_forward), the blocked inference
    path (FeedForward.block, blocks of 3 rows here; the conv skip added in place) and the plain unblocked
    one (torch.compile's)."""
    import nystrom.model.layers as layers
    from nystrom.model import NystromformerConfig, NystromformerModel

    torch.manual_seed(2)
    cfg = NystromformerConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=24, dropout=0.0,
                              norm_position=norm_position, final_norm=norm_position == "pre",
                              attention={"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 3})  # fmt: skip
    model = NystromformerModel(cfg).double().eval()
    ids = torch.randint(0, 40, (2, 11))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 8:] = 0
    train_path = model(ids, mask).last_hidden_state  # grad enabled: feed_forward
    monkeypatch.setattr(layers, "FFN_BLOCK_BYTES", 3 * 32 * 8)
    with torch.no_grad():
        blocked = model(ids, mask).last_hidden_state
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # the traced (plain) paths
    plain = model(ids, mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(blocked[real], train_path.detach()[real], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(plain.detach()[real], train_path.detach()[real], rtol=1e-12, atol=1e-12)
