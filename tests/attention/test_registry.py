"""Every attention variant honours the one interface: shapes, padding, dtypes, autocast, gradients, errors.

Runs over every entry of ``nystrom.attention.REGISTRY`` plus the baseline modules (in case the registry
does not list them yet). Legend: b batch, n tokens, e model dim.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from nystrom.attention import REGISTRY, AttentionBase
from nystrom.attention.linformer import LinformerAttention
from nystrom.attention.longformer import LongformerAttention
from nystrom.attention.performer import PerformerAttention
from nystrom.attention.reformer import ReformerAttention

VARIANTS: dict[str, type[AttentionBase]] = {
    **{
        cls.name: cls
        for cls in (LinformerAttention, LongformerAttention, PerformerAttention, ReformerAttention)
    },
    **REGISTRY,
}
#: small options so that n = 37 exercises each method's non-trivial path (several blocks/chunks/landmarks)
SMALL_OPTIONS: dict[str, dict[str, object]] = {
    "nystrom": {"num_landmarks": 8},
    "linformer": {"max_seq_len": 64, "proj_len": 16},
    "longformer": {"window_size": 9},
    "performer": {"num_features": 32},
    "reformer": {"bucket_size": 8},
}
#: bf16 vs float32/64 relative error bound: measured worst case 0.0055 over all variants and 5 seeds
#: (bf16 eps = 2^-8 = 0.0039); Reformer reaches 0.036 if its hashing is done in bf16 (bucket flips)
BF16_TOL = 0.02
DIM, B, N = 32, 2, 37
NAMES = sorted(VARIANTS)


def build(name: str, **extra: object) -> AttentionBase:
    cls = VARIANTS[name]
    required = [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name not in SMALL_OPTIONS.get(name, {})
    ]
    assert not required, f"{name}: add its required options {required} to SMALL_OPTIONS"
    return cls(DIM, **{"heads": 2, "dim_head": 16, **SMALL_OPTIONS.get(name, {}), **extra}).eval()


def inputs(dtype=torch.float32):
    x = torch.randn(B, N, DIM, dtype=dtype)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 23:] = False
    return x, mask


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("name", NAMES)
def test_interface_signature_and_name(name):
    cls = VARIANTS[name]
    assert cls.name == name and issubclass(cls, AttentionBase)
    params = inspect.signature(cls).parameters
    assert next(iter(params)) == "dim"
    for opt, default in (("heads", 8), ("dim_head", 64), ("qkv_bias", True), ("dropout", 0.0)):
        assert params[opt].kind is inspect.Parameter.KEYWORD_ONLY and params[opt].default == default
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_padding_content_is_ignored(name):
    mod = build(name).double()
    x, mask = inputs(torch.float64)
    y = mod(x, mask)
    assert y.shape == (B, N, DIM) and y.dtype == torch.float64 and torch.isfinite(y).all()
    x2 = x.clone()
    x2[1, 23:] = 30 * torch.randn(N - 23, DIM, dtype=torch.float64)  # new garbage in the padding
    y2 = mod(x2, mask)
    assert torch.allclose(y2[1, :23], y[1, :23], atol=1e-10), "padded tokens leaked into real outputs"
    assert torch.allclose(y2[0], y[0], atol=1e-10), "one sample's padding leaked into another sample"
    assert torch.equal(mod(x, torch.ones(B, N, dtype=torch.bool)), mod(x)), "all-True mask must equal no mask"
    assert mod(x[:1, :1]).shape == (1, 1, DIM)  # a single token works


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_in_eval_and_state_dict_round_trip(name):
    mod = build(name)
    x, mask = inputs()
    y = mod(x, mask)
    assert torch.equal(mod(x, mask), y)
    torch.manual_seed(123)  # a fresh build draws different weights; the state dict must restore everything
    clone = build(name)
    clone.load_state_dict(mod.state_dict())
    assert torch.equal(clone(x, mask), y)


@pytest.mark.parametrize("name", NAMES)
def test_float64_float32_bfloat16_agree(name):
    mod = build(name)
    x, mask = inputs()
    y32 = mod(x, mask)
    y64 = copy.deepcopy(mod).double()(x.double(), mask)
    ybf = copy.deepcopy(mod).bfloat16()(x.bfloat16(), mask)
    assert y64.dtype == torch.float64 and ybf.dtype == torch.bfloat16 and y32.dtype == torch.float32
    assert rel(y32, y64) < 1e-4
    assert torch.isfinite(ybf).all() and rel(ybf, y64) < BF16_TOL


@pytest.mark.parametrize("name", NAMES)
def test_autocast_bfloat16(name):
    mod = build(name)
    x, mask = inputs()
    y32 = mod(x, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mod(x, mask)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    assert rel(y, y32) < BF16_TOL


@pytest.mark.parametrize("name", NAMES)
def test_gradients_flow(name):
    mod = build(name).train()
    x, mask = inputs()
    x.requires_grad_(True)
    (mod(x, mask) * mask[..., None]).square().sum().backward()  # loss on real tokens only
    assert torch.isfinite(x.grad).all() and x.grad[:, :23].abs().sum() > 0
    assert torch.equal(x.grad[1, 23:], torch.zeros(N - 23, DIM)), "padded inputs must get no gradient"
    for pname, p in mod.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}.{pname} has no finite grad"
        assert p.grad.abs().sum() > 0, f"{name}.{pname} got an all-zero gradient"


@pytest.mark.parametrize("name", NAMES)
def test_bad_inputs_raise(name):
    mod = build(name)
    x, mask = inputs()
    with pytest.raises(ValueError, match="x must have shape"):
        mod(x[0])
    with pytest.raises(ValueError, match="x must have shape"):
        mod(torch.randn(B, N, DIM + 1))
    with pytest.raises(TypeError, match="floating-point"):
        mod(torch.ones(B, N, DIM, dtype=torch.long))
    with pytest.raises(TypeError, match=r"torch\.bool"):
        mod(x, mask.float())
    with pytest.raises(ValueError, match="mask must have shape"):
        mod(x, mask[:, :-1])
    bad = mask.clone()
    bad[0] = False
    with pytest.raises(ValueError, match="no real token"):
        mod(x, bad)
    with pytest.raises(ValueError, match="heads"):
        build(name, heads=0)
    with pytest.raises(ValueError, match="dropout"):
        build(name, dropout=1.5)
