"""Regression tests: the one mask convention, NaN/Inf at padded positions, dtype mismatch, double backward."""

import pytest
import torch

from attention.test_registry import NAMES, build, inputs
from nystrom.functional import nystrom_attention, softmax_attention
from nystrom.ops.baselines.linear import linear_attention
from nystrom.ops.baselines.linformer import linformer_attention
from nystrom.ops.baselines.longformer import sliding_window_attention
from nystrom.ops.baselines.performer import orthogonal_random_features, performer_attention
from nystrom.ops.baselines.reformer import lsh_attention, lsh_num_buckets, random_rotations
from nystrom.ops.nystrom.naive import nystrom_attention_materialized

from oracle import right_pad_mask

L = 23  # real tokens of sample 1 in attention/test_registry.py inputs()


def _poison(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x with NaN, +Inf and -Inf at the padded positions."""
    bad = x.clone()
    pad = ~mask
    vals = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=x.dtype)
    bad[pad] = vals[torch.arange(int(pad.sum())) % 3].to(x.dtype)[:, None].expand(-1, x.shape[-1])
    return bad


def _run(mod, x, mask):
    x = x.clone().requires_grad_(True)
    mod.zero_grad()
    out = mod(x, mask)
    (out * mask[..., None]).sum().backward()  # real outputs only
    return out.detach(), x.grad, {k: p.grad.clone() for k, p in mod.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", NAMES)
def test_nan_and_inf_at_padding_change_no_real_output_or_gradient(name):
    mod = build(name).double()
    x, mask = inputs(torch.float64)
    clean = _run(mod, x, mask)
    bad = _run(mod, _poison(x, mask), mask)
    assert torch.isfinite(bad[0]).all()  # padded rows unspecified but finite
    assert torch.allclose(bad[0][mask], clean[0][mask], rtol=0, atol=1e-12)
    assert torch.isfinite(bad[1]).all() and torch.allclose(bad[1][mask], clean[1][mask], atol=1e-12)
    assert bad[1][~mask].abs().max() == 0  # no gradient flows to padding
    for k, g in clean[2].items():
        assert torch.isfinite(bad[2][k]).all() and torch.allclose(bad[2][k], g, atol=1e-12), k


def _functionals(n: int, d: int):
    e = torch.randn(16, n, dtype=torch.float64) / 4
    w = orthogonal_random_features(32, d).double()
    rot = random_rotations(2, d, lsh_num_buckets(n, 8)).double()
    return {
        "nystrom": lambda q, k, v, m: nystrom_attention(q, k, v, num_landmarks=8, mask=m),
        "nystrom_front_padded": lambda q, k, v, m: nystrom_attention(
            q, k, v, num_landmarks=8, mask=m, segments="front_padded"
        ),
        "materialized": lambda q, k, v, m: nystrom_attention_materialized(q, k, v, num_landmarks=8, mask=m),
        "softmax": lambda q, k, v, m: softmax_attention(q, k, v, mask=m),
        "linear": lambda q, k, v, m: linear_attention(q, k, v, mask=m),
        "linformer": lambda q, k, v, m: linformer_attention(q, k, v, e, e, mask=m),
        "longformer": lambda q, k, v, m: sliding_window_attention(q, k, v, window_size=9, mask=m),
        "performer": lambda q, k, v, m: performer_attention(q, k, v, w, mask=m),
        "reformer": lambda q, k, v, m: lsh_attention(q, v, rot, bucket_size=8, mask=m),
    }


@pytest.mark.parametrize("name", sorted(_functionals(37, 8)))
def test_functional_nan_at_padded_q_k_v(name):
    n, d = 37, 8
    fn = _functionals(n, d)[name]
    mask = right_pad_mask([n, L], n)
    clean = [torch.randn(2, 2, n, d, dtype=torch.float64) for _ in range(3)]
    bad = [t.clone() for t in clean]
    for i, t in enumerate(bad):
        t[1, :, L:] = (float("nan"), float("inf"), float("-inf"))[i]
    bad = [t.requires_grad_(True) for t in bad]
    out_c, out_b = fn(*clean, mask), fn(*bad, mask)
    assert torch.isfinite(out_b).all()
    assert torch.allclose(out_b[1, :, :L], out_c[1, :, :L], atol=1e-12)
    out_b[1, :, :L].sum().backward()
    assert all(t.grad is None or torch.isfinite(t.grad).all() for t in bad)  # reformer: k unused


def test_nan_at_a_real_token_is_still_reported():
    q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
    v[0, 1, 3, 0] = float("nan")
    with pytest.raises(ValueError, match="v at a real"):
        nystrom_attention(q, k, v, num_landmarks=8, mask=right_pad_mask([30], 40))


def test_key_padding_mask_raises_stating_the_convention():
    q = k = v = torch.randn(1, 1, 8, 4)
    m = torch.ones(1, 8, dtype=torch.bool)
    calls = [
        lambda: nystrom_attention(q, k, v, num_landmarks=4, key_padding_mask=m),
        lambda: softmax_attention(q, k, v, key_padding_mask=m),
        lambda: nystrom_attention_materialized(q, k, v, num_landmarks=4, key_padding_mask=m),
    ] + [lambda name=name: build(name)(torch.randn(1, 8, 32), key_padding_mask=m) for name in NAMES]
    for call in calls:
        with pytest.raises(TypeError, match=r"mask=.*True = real token.*nn\.MultiheadAttention.*opposite"):
            call()


@pytest.mark.parametrize("name", NAMES)
def test_dtype_mismatch_names_both_dtypes(name):
    mod = build(name)  # float32
    x, mask = inputs(torch.float64)
    with pytest.raises(TypeError, match=r"torch\.float64.*torch\.float32.*module\.to"):
        mod(x, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast mixes dtypes on purpose: allowed
        assert mod(x.float().bfloat16(), mask).shape == x.shape


def test_double_backward_raises_not_implemented_and_materialized_works():
    mod = build("nystrom")
    x = torch.randn(1, 16, 32, requires_grad=True)
    (g,) = torch.autograd.grad(mod(x).square().sum(), x)  # first order: fine
    assert torch.isfinite(g).all()
    with pytest.raises(NotImplementedError, match="double backward.*nystrom_factors"):
        torch.autograd.grad(mod(x).square().sum(), x, create_graph=True)
    q = torch.randn(1, 1, 16, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(nystrom_attention(q, q, q, num_landmarks=4).sum(), q, create_graph=True)
    (g,) = torch.autograd.grad(
        nystrom_attention_materialized(q, q, q, num_landmarks=4).square().sum(), q, create_graph=True
    )
    (hvp,) = torch.autograd.grad(g.sum(), q)  # second order through the plain-ops path
    assert torch.isfinite(hvp).all() and hvp.abs().max() > 0


def test_unchecked_empty_mask_row_gives_zeros_not_a_crash(monkeypatch):
    """Where value checks are off (GPU, compile), a sample without a real token must not divide by 0."""
    import nystrom.ops.nystrom.cpu as cpu_path
    import nystrom.utils.checks as checks

    monkeypatch.setattr(checks, "value_checks_enabled", lambda t: False)
    monkeypatch.setattr(cpu_path, "value_checks_enabled", lambda t: False)
    q = torch.randn(2, 2, 20, 8)
    mask = right_pad_mask([20, 0], 20)
    out = nystrom_attention(q, q, q, num_landmarks=4, mask=mask)
    assert torch.allclose(out[0], nystrom_attention(q[:1], q[:1], q[:1], num_landmarks=4)[0], atol=1e-6)
    assert out[1].abs().max() == 0
