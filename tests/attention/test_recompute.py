"""``recompute=True``: head-by-head recomputation in the backward (attention/recompute.py).

Same outputs and gradients as the plain path (float64, with groups of every size), padding inert, only
``x`` and the weights saved for the backward, and clear errors where it cannot apply.
"""

from __future__ import annotations

import copy

import pytest
import torch

import nystrom.attention.recompute as rc
from nystrom.attention import REGISTRY
from nystrom.model import NystromformerConfig, NystromformerForSequenceClassification

VARIANTS = {
    "nystrom": dict(num_landmarks=8, conv_kernel_size=5),
    "nystrom-nobias": dict(num_landmarks=8, conv_kernel_size=None, qkv_bias=False),
    "softmax": dict(conv_kernel_size=3),
    "linear": {},
}


def _pair(spec: str, **extra) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    plain = REGISTRY[spec.split("-")[0]](32, heads=4, dim_head=8, **VARIANTS[spec], **extra).double()
    lean = copy.deepcopy(plain)
    lean.recompute = True
    return plain, lean


def _fwd_bwd(mod, x, mask, g):
    x = x.detach().clone().requires_grad_()
    mod.zero_grad(set_to_none=True)
    y = mod(x, mask=mask)
    (y * g).sum().backward()
    return y.detach(), x.grad, {k: p.grad for k, p in mod.named_parameters()}


@pytest.mark.parametrize("spec", sorted(VARIANTS))
@pytest.mark.parametrize("groups", ["one", "per_head"])
def test_recompute_matches_plain_path(spec, groups, monkeypatch):
    if groups == "per_head":  # every head its own group, forward and backward
        monkeypatch.setattr(rc, "GROUP_BYTES", 1)
        monkeypatch.setattr(rc, "FORWARD_GROUP_BYTES", 1)
    plain, lean = _pair(spec)
    torch.manual_seed(1)
    x = torch.randn(3, 50, 32, dtype=torch.double)
    mask = torch.ones(3, 50, dtype=torch.bool)
    mask[1, 30:] = False
    mask[2, 5:] = False
    g = torch.randn(3, 50, 32, dtype=torch.double)
    y0, dx0, dp0 = _fwd_bwd(plain, x, mask, g)
    y1, dx1, dp1 = _fwd_bwd(lean, x, mask, g)
    torch.testing.assert_close(y1, y0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx1, dx0, rtol=1e-11, atol=1e-11)
    assert dp1.keys() == dp0.keys() and len(dp0) >= 3
    for k in dp0:
        torch.testing.assert_close(dp1[k], dp0[k], rtol=1e-11, atol=1e-11, msg=k)


def test_recompute_padding_is_inert(monkeypatch):
    """NaN at padded positions changes no real output and gets a zero gradient, group by group."""
    monkeypatch.setattr(rc, "GROUP_BYTES", 1)
    _, lean = _pair("nystrom")
    torch.manual_seed(2)
    x = torch.randn(2, 40, 32, dtype=torch.double)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, 25:] = False
    g = torch.randn(2, 40, 32, dtype=torch.double) * mask[..., None]
    y0, dx0, dp0 = _fwd_bwd(lean, x, mask, g)
    x_nan = x.masked_fill(~mask[..., None], float("nan"))
    y1, dx1, dp1 = _fwd_bwd(lean, x_nan, mask, g)
    torch.testing.assert_close(y1[mask], y0[mask], rtol=0, atol=0)
    assert torch.equal(dx1[~mask], torch.zeros_like(dx1[~mask]))
    for k in dp0:
        assert torch.isfinite(dp1[k]).all(), k
        torch.testing.assert_close(dp1[k], dp0[k], rtol=0, atol=0, msg=k)


def _saved_bytes(mod, x) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mod(x)
    return total


def test_recompute_saves_only_the_input():
    """What the forward keeps for the backward: the input and the weights, not q/k/v or the heads."""
    plain, lean = _pair("nystrom")
    x = torch.randn(1, 2048, 32, dtype=torch.double, requires_grad=True)
    u = x.numel() * x.element_size()  # one (b, n, e) tensor
    weights = sum(p.numel() * p.element_size() for p in lean.parameters())
    assert _saved_bytes(lean, x) <= u + weights
    assert _saved_bytes(plain, x) >= 4 * u  # q, k, v and the merged heads


def test_recompute_off_without_grad():
    plain, lean = _pair("nystrom")
    x = torch.randn(2, 20, 32, dtype=torch.double)
    with torch.no_grad():
        torch.testing.assert_close(lean(x), plain(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["linformer", "performer", "reformer", "longformer"])
def test_recompute_refused_where_heads_are_not_independent(name):
    """Variants with shared or random per-call state have no such option; the config says so."""
    with pytest.raises(ValueError, match="recompute"):
        NystromformerConfig(attention={"name": name, "recompute": True})


def test_recompute_needs_a_head_separable_core():
    from nystrom.attention import AttentionBase

    class Mixing(AttentionBase):  # e.g. a core that shares state across heads
        pass

    with pytest.raises(ValueError, match="recompute=True needs a core"):
        Mixing(32, heads=4, dim_head=8, recompute=True)


def test_recompute_must_be_bool():
    with pytest.raises(TypeError, match="recompute must be a bool"):
        REGISTRY["nystrom"](32, heads=4, dim_head=8, recompute=1)


def test_recompute_refuses_tracing(monkeypatch):
    _, lean = _pair("nystrom")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(RuntimeError, match="torch.compile cannot trace"):
        rc.recompute_attention(
            torch.randn(1, 4, 32, dtype=torch.double, requires_grad=True), None, lean.qkv.weight,
            lean.qkv.bias, None, lean.out.weight, lean.out.bias, attend=lean.attend, heads=4,
        )  # fmt: skip


def test_recompute_through_the_model_config():
    """``attention={"name": "nystrom", "recompute": True}`` trains the same as the plain model."""
    kw = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=64, num_labels=3)  # fmt: skip
    plain_cfg = NystromformerConfig(attention={"name": "nystrom", "num_landmarks": 4}, **kw)
    lean_cfg = NystromformerConfig(attention={"name": "nystrom", "num_landmarks": 4, "recompute": True}, **kw)
    torch.manual_seed(0)
    plain = NystromformerForSequenceClassification(plain_cfg).eval()
    lean = NystromformerForSequenceClassification(lean_cfg).eval()
    lean.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 50, (2, 24))
    am = torch.ones(2, 24, dtype=torch.long)
    am[1, 15:] = 0
    labels = torch.tensor([0, 2])
    grads = []
    for model in (plain, lean):
        model(input_ids=ids, attention_mask=am, labels=labels).loss.backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-4, atol=1e-6, msg=k)
    assert lean.nystromformer.encoder.layers[0].attention.recompute is True


def test_recompute_under_autocast_matches_plain_path():
    """bf16 autocast: the backward recomputes under the forward's autocast state, so the two agree."""
    plain, lean = _pair("nystrom")
    plain, lean = plain.float(), lean.float()
    torch.manual_seed(3)
    x = torch.randn(2, 60, 32)
    mask = torch.ones(2, 60, dtype=torch.bool)
    mask[1, 40:] = False
    g = torch.randn(2, 60, 32)
    out = []
    for mod in (plain, lean):
        xs = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = mod(xs, mask=mask)
        assert y.dtype == torch.bfloat16
        (y.float() * g).sum().backward()
        assert xs.grad.dtype == torch.float32 and mod.qkv.weight.grad.dtype == torch.float32
        out.append((y.float(), xs.grad, mod.qkv.weight.grad, mod.out.weight.grad))
    # Both paths round to bf16 (unit roundoff u = 2^-8) at different places: the recompute rebuilds q/k/v
    # one group of heads at a time. Element-wise bounds are not stable in bf16 (an element of a gradient
    # summed over tokens can differ by many ulps of the largest one: 0.06-0.16 absolute seen across seeds),
    # so the bound is norm-wise: the backward passes ~4 bf16 roundings between the two paths, relative
    # error <= 4u (measured 0.005-0.007 over 6 seeds; the forward and the output projection's gradient,
    # which the recompute does not touch, within one rounding).
    u = 2.0**-8
    for name, a, b, bound in zip(("y", "dx", "dW_qkv", "dW_out"), *out, (u, 4 * u, 4 * u, u)):
        rel = float((b - a).detach().norm() / a.detach().norm())
        assert rel <= bound, f"{name}: relative error {rel:.4f} > {bound:.4f}"
