"""The fused linear + cross-entropy (layers/cross_entropy.py) against F.linear + F.cross_entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nystrom.layers import cross_entropy as ce
from nystrom.layers.cross_entropy import linear_cross_entropy


def _reference(x, w, b, t, rw):
    logits = F.linear(x, w, b)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    losses = F.cross_entropy(logits, t, reduction="none")
    return (losses * rw).sum(), losses, logits.argmax(-1)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("block_rows", [1, 3, 1000])
def test_matches_cross_entropy_in_float64(monkeypatch, bias, block_rows):
    g = torch.Generator().manual_seed(0)
    k, e, v = 11, 8, 37
    monkeypatch.setattr(ce, "BLOCK_BYTES", 8 * v * block_rows)  # blocks of block_rows rows
    x = torch.randn(k, e, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, e, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(v, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    t = torch.randint(0, v, (k,), generator=g)
    rw = torch.rand(k, generator=g, dtype=torch.float64)
    loss, losses, preds = linear_cross_entropy(x, w, b, t, rw)
    ref, ref_losses, ref_preds = _reference(x, w, b, t, rw)
    assert losses.dtype == torch.float64 and not losses.requires_grad and not preds.requires_grad
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(losses, ref_losses.double(), rtol=1e-12, atol=1e-12)
    assert torch.equal(preds, ref_preds)
    params = [x, w] + ([b] if bias else [])
    got = torch.autograd.grad(3.0 * loss, params)
    want = torch.autograd.grad(3.0 * ref, params)
    for a, r in zip(got, want):
        assert a.dtype == r.dtype
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)


def test_tied_weight_gradient_adds_to_the_embedding_gradient():
    torch.manual_seed(1)
    emb = torch.nn.Embedding(20, 6)
    ids = torch.randint(0, 20, (9,))
    t = torch.randint(0, 20, (9,))
    rw = torch.full((9,), 1 / 9)
    linear_cross_entropy(emb(ids), emb.weight, None, t, rw)[0].backward()
    fused = emb.weight.grad.clone()
    emb.weight.grad = None
    _reference(emb(ids), emb.weight, None, t, rw)[0].backward()
    torch.testing.assert_close(fused, emb.weight.grad, rtol=1e-5, atol=1e-7)


def test_bfloat16_autocast_runs_the_products_in_bfloat16_and_stays_close():
    torch.manual_seed(2)
    x = torch.randn(40, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t, rw = torch.randint(0, 50, (40,)), torch.full((40,), 1 / 40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = linear_cross_entropy(x, w, None, t, rw)
        ref, _, _ = _reference(x, w, None, t, rw)
    gx, gw = torch.autograd.grad(loss, (x, w))
    rx, rw_ = torch.autograd.grad(ref, (x, w))
    assert gx.dtype == torch.float32 and gw.dtype == torch.float32  # gradients in the parameters' dtype
    torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-3)  # same bf16 logits
    torch.testing.assert_close(gx, rx, rtol=0.05, atol=2e-3)
    torch.testing.assert_close(gw, rw_, rtol=0.05, atol=2e-3)


def test_bad_targets_and_shapes_raise():
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"target must lie in \[0, 5\)"):
        linear_cross_entropy(x, w, None, torch.tensor([0, 5, 1]), torch.ones(3))
    with pytest.raises(ValueError, match="same e"):
        linear_cross_entropy(x, torch.randn(5, 3), None, torch.tensor([0, 1, 1]), torch.ones(3))
    with pytest.raises(TypeError, match="class indices"):
        linear_cross_entropy(x, w, None, torch.tensor([0.0, 1.0, 1.0]), torch.ones(3))


def test_masked_token_loss_is_the_mean_of_per_example_means():
    from nystrom.model import NystromformerConfig, NystromformerForMaskedLM
    from nystrom_lab.text.mlm import masked_token_loss

    torch.manual_seed(3)
    cfg = NystromformerConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=12, attention={"name": "softmax"})  # fmt: skip
    model = NystromformerForMaskedLM(cfg)
    hidden = torch.randn(3, 12, 16, requires_grad=True)
    labels = torch.full((3, 12), -100)
    labels[0, [1, 4, 7]] = torch.tensor([3, 4, 5])
    labels[1, 2] = 9  # one masked token; example 2 has none (adds 0 to the mean)
    loss, token_loss, predicted, target = masked_token_loss(model.lm_head, hidden, labels)
    logits = model.lm_head(hidden)  # (b, L, v)
    per_token = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=-100)  # (b, L)
    want = (per_token[0].sum() / 3 + per_token[1].sum() / 1 + 0.0) / 3
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(target, torch.tensor([3, 4, 5, 9]))
    assert torch.equal(predicted, logits[labels != -100].argmax(-1))
    g = torch.autograd.grad(loss, hidden)[0]
    torch.testing.assert_close(g, torch.autograd.grad(want, hidden)[0], rtol=1e-4, atol=1e-6)


def test_float16_gradients_do_not_underflow_before_loss_scaling():
    """In float16 the gradient products run in float32: a tiny row weight (1/(batch · masked tokens)) times
    a probability would underflow float16 before GradScaler's scale could help."""
    torch.manual_seed(4)
    x = torch.randn(6, 8, dtype=torch.float16, requires_grad=True)
    w = torch.randn(30, 8, dtype=torch.float16, requires_grad=True)
    t, rw = torch.randint(0, 30, (6,)), torch.full((6,), 1e-6, dtype=torch.float32)
    loss, _, _ = linear_cross_entropy(x, w, None, t, rw)
    (loss * 65536.0).backward()
    ref_x, ref_w = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    (_reference(ref_x, ref_w, None, t, rw)[0] * 65536.0).backward()
    assert x.grad.dtype == torch.float16 and bool((x.grad != 0).any())
    torch.testing.assert_close(x.grad.float(), ref_x.grad, rtol=2e-2, atol=1e-4)
    torch.testing.assert_close(w.grad.float(), ref_w.grad, rtol=2e-2, atol=1e-4)
