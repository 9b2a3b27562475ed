"""nystrom.compat.lucidrains against the installed nystrom-attention 0.0.14, with copied weights."""

import inspect
import math

import pytest
import torch

from nystrom.compat import lucidrains as ours

from oracle import rel_err

theirs = pytest.importorskip("nystrom_attention")


def _pair(cls_ours, cls_theirs, **kw):
    a = cls_theirs(**kw)
    b = cls_ours(**kw)
    b.load_state_dict(a.state_dict(), strict=True)
    return a.eval(), b.eval()


def _grads(mod, x, mask, real):
    x = x.clone().requires_grad_(True)
    out = mod(x, mask=mask)
    w = torch.randn_like(out)
    (out * w * real[..., None]).sum().backward()  # only real rows: padded outputs are unspecified
    return out, x.grad, {k: p.grad for k, p in mod.named_parameters()}


def _assert_same_as_lucidrains(theirs_mod, ours_mod, x, mask, real):
    """Forward, input gradient and every parameter gradient agree to 1e-4 on the real tokens."""
    torch.manual_seed(2)
    out_t, dx_t, dw_t = _grads(theirs_mod, x, mask, real)
    torch.manual_seed(2)
    out_o, dx_o, dw_o = _grads(ours_mod, x, mask, real)
    assert (out_o - out_t)[real].abs().max() <= 1e-4
    assert (dx_o - dx_t)[real].abs().max() <= 1e-4
    for k in dw_t:
        assert (dw_o[k] - dw_t[k]).abs().max() <= 1e-4 * max(1.0, dw_t[k].abs().max().item()), k


@pytest.mark.parametrize("name", ["NystromAttention", "Nystromformer"])
def test_signatures_and_state_dict_keys_match(name):
    sig_t = inspect.signature(getattr(theirs, name).__init__).parameters
    sig_o = inspect.signature(getattr(ours, name).__init__).parameters
    for p, spec in sig_t.items():
        assert sig_o[p].kind == spec.kind and sig_o[p].default == spec.default, p
    extra = set(sig_o) - set(sig_t)
    assert all(sig_o[p].kind == inspect.Parameter.KEYWORD_ONLY for p in extra)  # pinv_init only
    kw = dict(dim=32, depth=2) if name == "Nystromformer" else dict(dim=32)
    a, b = getattr(theirs, name)(**kw), getattr(ours, name)(**kw)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    a.load_state_dict(b.state_dict(), strict=True)  # and back


@pytest.mark.parametrize(
    "b, n, m, pad",
    [
        (2, 64, 8, None),  # n divisible by m, no mask
        (2, 60, 8, [60, 55]),  # n not divisible by m, with a mask (front padding masked out)
        (3, 61, 16, [61, 58, 60]),  # right padding too; every landmark run keeps a real token
    ],
)
def test_attention_forward_and_gradients_equal_lucidrains(b, n, m, pad):
    torch.manual_seed(1)
    a, o = _pair(ours.NystromAttention, theirs.NystromAttention, dim=32, dim_head=16, heads=2, num_landmarks=m)
    x = torch.randn(b, n, 32)
    mask = None if pad is None else torch.arange(n)[None] < torch.tensor(pad)[:, None]
    _assert_same_as_lucidrains(a, o, x, mask, torch.ones(b, n, dtype=torch.bool) if mask is None else mask)


def test_return_attn_is_the_n_by_n_matrix():
    torch.manual_seed(3)
    a, o = _pair(ours.NystromAttention, theirs.NystromAttention, dim=32, dim_head=16, heads=2, num_landmarks=8)
    x = torch.randn(2, 64, 32)
    out_t, attn_t = a(x, return_attn=True)
    out_o, attn_o = o(x, return_attn=True)
    assert attn_o.shape == (2, 2, 64, 64)
    assert (attn_o - attn_t).abs().max() <= 1e-5
    assert (out_o - out_t).abs().max() <= 1e-4
    _, (f, z, bmat) = o(x, return_attn_matrices=True)
    assert f.shape == (2, 2, 64, 8) and z.shape == (2, 2, 8, 8) and bmat.shape == (2, 2, 8, 64)
    # n not divisible by m: (b, h, n, n), the real block of lucidrains' padded matrix
    x = torch.randn(1, 60, 32)
    mask = torch.ones(1, 60, dtype=torch.bool)
    _, attn_t = a(x, mask=mask, return_attn=True)
    _, attn_o = o(x, mask=mask, return_attn=True)
    assert attn_t.shape == (1, 2, 64, 64) and attn_o.shape == (1, 2, 60, 60)
    assert (attn_o - attn_t[:, :, -60:, -60:]).abs().max() <= 1e-5


def test_stack_equals_lucidrains_with_mask():
    torch.manual_seed(4)
    kw = dict(dim=32, depth=2, dim_head=16, heads=2, num_landmarks=8, attn_values_residual_conv_kernel=5)
    a, o = _pair(ours.Nystromformer, theirs.Nystromformer, **kw)
    x = torch.randn(2, 50, 32)
    mask = torch.arange(50)[None] < torch.tensor([[50], [45]])
    _assert_same_as_lucidrains(a, o, x, mask, mask)


def test_without_mask_ours_stays_exact_where_lucidrains_pads_into_the_keys():
    torch.manual_seed(6)
    a, o = _pair(ours.NystromAttention, theirs.NystromAttention, dim=32, dim_head=16, heads=2, num_landmarks=8)
    x = torch.randn(2, 60, 32)  # 60 = 8·8 − 4: lucidrains pads 4 zero tokens at the front
    all_real = torch.ones(2, 60, dtype=torch.bool)
    exact = a(x, mask=all_real)  # lucidrains' own maths with the padding masked out
    unmasked = a(x)  # padding in the landmark means and the keys
    ours_out = o(x)
    assert (ours_out - exact).abs().max() <= 1e-5
    assert torch.equal(ours_out, o(x, mask=all_real))  # no mask == an all-True mask
    assert (unmasked - exact).abs().max() > 1e-3  # the difference documented in docs/lucidrains.md


def _front_padded_oracle(x_q, x_k, x_v, m):
    """float64, one sample and head: lucidrains' runs of ⌈n/m⌉ positions after front padding, empty runs
    dropped, exact pseudo-inverse. (n, d) x3 -> (n, d)."""
    n, d = x_q.shape
    run, pad = -(-n // m), -(-n // m) * m - n
    groups = [[t for t in range(n) if (t + pad) // run == j] for j in range(m)]
    groups = [g for g in groups if g]
    q_l = torch.stack([x_q[g].mean(0) for g in groups])
    k_l = torch.stack([x_k[g].mean(0) for g in groups])
    s = 1 / math.sqrt(d)
    f = torch.softmax(x_q @ k_l.T * s, -1)
    a = torch.softmax(q_l @ k_l.T * s, -1)
    bm = torch.softmax(q_l @ x_k.T * s, -1)
    return f @ torch.linalg.pinv(a) @ bm @ x_v


@pytest.mark.parametrize("accelerator", [False, True])
def test_empty_landmark_runs_are_dropped_exactly(accelerator):
    # n = 10, m = 8: runs of 2 after 6 padding positions, so 3 runs hold no real token; lucidrains mixes
    # them into A⁺ even with a mask, ours removes them, without a mask too, on the CPU's path and the GPU's
    # (which once took n ≥ m without a mask for "every landmark used")
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 1, 10, 4, dtype=torch.float64) for _ in range(3))
    from nystrom.functional import nystrom_attention
    from nystrom.utils.device import force_accelerator_path

    with force_accelerator_path() if accelerator else torch.no_grad():
        out = nystrom_attention(q, k, v, num_landmarks=8, segments="front_padded", pinv="exact")
    ref = _front_padded_oracle(q[0, 0], k[0, 0], v[0, 0], 8)
    assert rel_err(out[0, 0], ref) <= 1e-10


def test_drop_in_without_mask_is_the_same_on_the_gpu_path():
    """TransMIL's call: a bag whose length m does not divide, no mask, the drop-in's defaults
    (pinv_init="original", which the fused kernels do not take, so a GPU runs the composite accelerator
    path). 70 tokens, 16 landmarks: runs of 5 after 10 padding positions, the first two runs empty."""
    from nystrom.utils.device import force_accelerator_path

    torch.manual_seed(9)
    mod = ours.NystromAttention(dim=32, dim_head=16, heads=2, num_landmarks=16).double().eval()
    x = torch.randn(2, 70, 32, dtype=torch.float64)
    with torch.no_grad():
        cpu = mod(x)
        with force_accelerator_path():
            acc = mod(x)
    assert rel_err(acc, cpu) <= 1e-10


def test_pinv_init_original_is_lucidrains_batch_global_scaling():
    torch.manual_seed(8)
    a, o = _pair(ours.NystromAttention, theirs.NystromAttention, dim=32, dim_head=16, heads=4, num_landmarks=8)
    o_pm = ours.NystromAttention(32, dim_head=16, heads=4, num_landmarks=8, pinv_init="per_matrix").eval()
    o_pm.load_state_dict(a.state_dict())
    x = torch.randn(3, 64, 32) * 3
    assert (o(x) - a(x)).abs().max() <= 1e-4
    # per-matrix scaling: each sample's output is its own (batch-independent)
    assert (o_pm(x)[1:2] - o_pm(x[1:2])).abs().max() <= 1e-5


def test_mask_convention_and_bad_input():
    mod = ours.NystromAttention(16, dim_head=8, heads=2, num_landmarks=4)
    x = torch.randn(1, 8, 16)
    with pytest.raises(TypeError, match="True = real token"):
        mod(x, key_padding_mask=torch.ones(1, 8, dtype=torch.bool))
    with pytest.raises(TypeError, match="float64.*float32"):
        mod(x.double())
