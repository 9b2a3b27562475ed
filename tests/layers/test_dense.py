"""Inference linear layers with the activation fused into oneDNN's GEMM (layers/dense.py).

Legend: r rows, i input width, o output width, b batch, n tokens, e hidden size.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nystrom.layers.dense import activation, dense, dense_module, fused_dtype, fuses
from nystrom.layers.onednn import POST_OPS, linear_supports
from nystrom.model import NystromformerConfig, NystromformerModel

onednn = pytest.mark.skipif(
    not linear_supports(torch.float32), reason="no oneDNN fp32 linear on this build/CPU"
)
FP32_FUSED = linear_supports(torch.float32)  # bf16 is fused wherever fp32 is: in fp32 on AVX2-only CPUs
ACTS = [None, "gelu", "gelu_new", "relu"]


def _reference(x, w, b, act):
    return activation(act, F.linear(x.double(), w.double(), None if b is None else b.double()))


@onednn
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [True, False])
def test_fused_path_is_taken_and_equals_linear_then_activation(monkeypatch, act, bias):
    torch.manual_seed(0)
    x, w = torch.randn(2, 37, 24), torch.randn(40, 24) * 0.2  # (b, n, i), (o, i)
    b = torch.randn(40) if bias else None
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    class Spy:  # counts calls of the oneDNN op without changing it
        def __call__(self, *args):
            calls.append(args[3:])
            return real(*args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", Spy())
    with torch.inference_mode():
        assert fuses(x, w, b)
        y = dense(x, w, b, activation_name=act)
    assert calls == [(POST_OPS[act][0], [], POST_OPS[act][1])]
    assert y.shape == (2, 37, 40) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), _reference(x, w, b, act), rtol=1e-5, atol=1e-5)


def test_bfloat16_matches_float64_reference():
    """Fused in bf16 where this CPU's oneDNN has bf16 kernels, in fp32 rounded to bf16 elsewhere."""
    torch.manual_seed(0)
    x, w, b = torch.randn(64, 32), torch.randn(48, 32) * 0.2, torch.randn(48)
    with torch.no_grad():
        assert fuses(x.bfloat16(), w.bfloat16(), b.bfloat16()) == FP32_FUSED
        y = dense(x.bfloat16(), w.bfloat16(), b.bfloat16(), activation_name="gelu")
    assert y.dtype == torch.bfloat16
    ref = _reference(x.bfloat16().float(), w.bfloat16().float(), b.bfloat16().float(), "gelu")
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)


def test_not_fused_with_autograd_or_float64_and_same_values():
    torch.manual_seed(0)
    x, w = torch.randn(5, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        assert not fuses(x, w, None)  # float64
    assert not fuses(x.float(), w.detach().float(), None)  # autograd on
    y = dense(x, w, None, activation_name="gelu")  # autograd path: exactly F.linear + gelu, with gradients
    assert torch.equal(y, F.gelu(F.linear(x, w)))
    y.sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_under_autocast_runs_in_autocast_dtype_like_linear():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 33, 32), torch.randn(48, 32) * 0.2, torch.randn(48)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused_dtype(x, w, b) == (torch.bfloat16 if FP32_FUSED else None)
        y = dense(x, w, b, activation_name="gelu")
        ref = F.gelu(F.linear(x, w, b))  # autocast's own path: bf16 operands and result
    assert y.dtype == ref.dtype == torch.bfloat16 and y.shape == (2, 33, 48)
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_unknown_activation_raises():
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        dense(x, w, None, activation_name="swish")
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        activation("swish", x)


def test_wrapped_or_hooked_linear_is_called_not_bypassed():
    class Scaled(nn.Linear):  # e.g. an adapter: its forward must run
        def forward(self, x):
            return 2 * super().forward(x)

    torch.manual_seed(0)
    x = torch.randn(3, 4)
    layer = Scaled(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(
            dense_module(layer, x, activation_name="relu"), F.relu(2 * F.linear(x, layer.weight, layer.bias))
        )
        plain = nn.Linear(4, 5)
        seen = []
        plain.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
        dense_module(plain, x)
    assert seen == [torch.Size([3, 5])]


@onednn
@pytest.mark.parametrize(
    "attention", [{"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 5}, {"name": "softmax"}]
)
def test_model_inference_equals_the_aten_path(monkeypatch, attention):
    cfg = NystromformerConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=64, attention=attention)  # fmt: skip
    torch.manual_seed(0)
    model = NystromformerModel(cfg).eval()
    ids = torch.randint(0, 50, (2, 40))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 30:] = 0
    with torch.inference_mode():
        fused = model(ids, attention_mask=mask).last_hidden_state
        monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)  # PyTorch's switch for oneDNN paths
        assert not fuses(ids.float(), ids.float(), None)
        plain = model(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused[1, :30], plain[1, :30], rtol=1e-5, atol=1e-5)
    assert not torch.equal(fused, plain)  # the two paths did run different kernels


@onednn
@pytest.mark.parametrize("autocast", [False, True])
def test_bfloat16_without_bf16_kernels_computes_in_float32(monkeypatch, autocast):
    """As on an AVX2-only CPU: oneDNN runs fp32 only, so a bf16 linear is an fp32 GEMM rounded to bf16."""
    import nystrom.layers.onednn as O

    monkeypatch.setattr(O, "_probed", {torch.float32: True, torch.bfloat16: False})
    seen = []
    real = torch.ops.mkldnn._linear_pointwise

    def spy(*args):
        seen.append((args[0].dtype, args[1].dtype))
        return real(*args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 40, 32), torch.randn(48, 32) * 0.2, torch.randn(48)
    if not autocast:
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        assert O.linear_compute_dtype(torch.bfloat16) == torch.float32
        y = dense(x, w, b, activation_name="gelu")
    assert seen == [(torch.float32, torch.float32)] and y.dtype == torch.bfloat16 and y.shape == (3, 40, 48)
    xb, wb, bb = (t.bfloat16().double() for t in (x, w, b))  # the operands as autocast rounds them
    ref = _reference(xb, wb, bb, "gelu")
    err = (y.double() - ref).abs().max().item()
    assert err <= ref.abs().max().item() * 2**-8  # within bf16's rounding of the result alone
