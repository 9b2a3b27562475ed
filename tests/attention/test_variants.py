"""Baseline variants (Linear, Linformer, Longformer, Performer, Reformer) against float64 references.

Each reference is written plainly from the method's definition (einsum sums, dense (n, n) masks, loops),
a different code path from the fast chunked/batched implementation it checks.
Legend: b batch, h heads, n tokens, d head dim, p projection length, m random features.
"""

from __future__ import annotations

import math

import pytest
import torch

from nystrom.attention.linear import LinearAttention
from nystrom.attention.linformer import LinformerAttention
from nystrom.attention.longformer import LongformerAttention
from nystrom.attention.performer import PerformerAttention
from nystrom.attention.reformer import ReformerAttention
from nystrom.ops.baselines.linear import elu_feature_map, linear_attention
from nystrom.ops.baselines.linformer import linformer_attention
from nystrom.ops.baselines.longformer import sliding_window_attention
from nystrom.ops.baselines.performer import favor_features, orthogonal_random_features, performer_attention
from nystrom.ops.baselines.reformer import SELF_LOGIT, lsh_attention, lsh_num_buckets, random_rotations

from oracle import linear_oracle, softmax_oracle

F64 = torch.float64


def qkv(b=2, h=3, n=37, d=8, amp=1.0):
    return [amp * torch.randn(b, h, n, d, dtype=F64) for _ in range(3)]


def pad_mask(lengths, n):
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (b, n)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------- linear (ELU)
@pytest.mark.parametrize("masked", [False, True])
def test_linear_matches_oracle(masked):
    q, k, v = qkv(amp=2.0)  # |x| up to ~8: both branches of elu (x + 1 and exp(x)) are exercised
    mask = pad_mask([37, 21], 37) if masked else None
    out = linear_attention(q, k, v, mask=mask)
    q_ref = q if mask is None else q.masked_fill(~mask[:, None, :, None], 0)  # padded rows: of zeroed q
    assert torch.allclose(out, linear_oracle(q_ref, k, v, mask), atol=1e-12, rtol=1e-10)


def test_linear_feature_map_and_normalisation():
    x = torch.tensor([-30.0, -1.0, 0.0, 0.5, 3.0], dtype=F64)
    assert torch.allclose(
        elu_feature_map(x), torch.tensor([math.exp(-30), math.exp(-1), 1.0, 1.5, 4.0], dtype=F64)
    )
    q, k, _ = qkv(n=11)
    v = torch.full((2, 3, 11, 5), 7.0, dtype=F64)  # weights sum to 1: constant values come back exactly
    assert torch.allclose(linear_attention(q, k, v), v, atol=1e-12)
    # one real key: every query returns that key's value, whatever the padding holds
    k[0, :, 1:] = torch.nan
    v = torch.randn(2, 3, 11, 4, dtype=F64)
    v[0, :, 1:] = torch.nan
    out = linear_attention(q, k, v, mask=pad_mask([1, 11], 11))
    assert torch.allclose(out[0], v[0, :, :1].expand(3, 11, 4), atol=1e-12)
    # no underflow to 0/0 when every feature is ~exp(-200)
    tiny = linear_attention(-200 + q.float(), -200 + k.nan_to_num(0).float(), v.nan_to_num(0).float())
    assert torch.isfinite(tiny).all()


def test_linear_nan_padding_ends_like_a_short_run_and_gets_no_gradient():
    mod = LinearAttention(16, heads=2, dim_head=8).double()
    x = torch.randn(2, 30, 16, dtype=F64)
    mask = pad_mask([30, 12], 30)
    x_nan = x.clone()
    x_nan[1, 12:] = torch.nan
    out = mod(x_nan, mask)
    assert torch.allclose(out[1, :12], mod(x[1:, :12])[0], atol=1e-12)
    assert torch.allclose(out[0], mod(x[:1])[0], atol=1e-12)  # batch-mates do not interact
    # gradients: huge finite garbage (a NaN input row poisons any Linear's weight gradient, 0 * NaN)
    x_big = x.clone()
    x_big[1, 12:] = 1e4
    x_big.requires_grad_(True)
    (mod(x_big, mask) * mask[..., None]).sum().backward()
    assert torch.isfinite(x_big.grad).all() and torch.equal(
        x_big.grad[1, 12:], torch.zeros(18, 16, dtype=F64)
    )
    assert all(torch.isfinite(p.grad).all() for p in mod.parameters())


# ---------------------------------------------------------------- Linformer
def linformer_ref(q, k, v, e, f, mask):
    n = q.shape[2]
    keep = torch.ones(q.shape[0], n, dtype=F64) if mask is None else mask.to(F64)
    k_p = torch.einsum("aj,bj,bhjd->bhad", e[:, :n], keep, k)  # sum over tokens j of E[a, j] k_j
    v_p = torch.einsum("aj,bj,bhjd->bhad", f[:, :n], keep, v)
    s = torch.einsum("bhid,bhad->bhia", q, k_p) / math.sqrt(q.shape[-1])
    w = torch.exp(s - s.amax(-1, keepdim=True))
    return torch.einsum("bhia,bhad->bhid", w / w.sum(-1, keepdim=True), v_p)


@pytest.mark.parametrize("masked", [False, True])
def test_linformer_matches_reference(masked):
    q, k, v = qkv()
    e, f = torch.randn(2, 12, 50, dtype=F64).unbind(0)  # N = 50 > n = 37: first 37 columns used
    mask = pad_mask([37, 21], 37) if masked else None
    out = linformer_attention(q, k, v, e, f, mask=mask)
    q_ref = q if mask is None else q.masked_fill(~mask[:, None, :, None], 0)  # padded rows: of zeroed q
    assert torch.allclose(out, linformer_ref(q_ref, k, v, e, f, mask), atol=1e-12, rtol=1e-10)


def test_linformer_identity_projection_is_softmax():
    q, k, v = qkv(n=16)
    eye = torch.eye(16, dtype=F64)
    out = linformer_attention(q, k, v, eye, eye)
    assert torch.allclose(out, softmax_oracle(q, k, v), atol=1e-12)


def test_linformer_end_padding_equals_short_run_and_rejects_long_input():
    mod = LinformerAttention(16, heads=2, dim_head=8, max_seq_len=40, proj_len=6).double()
    x = torch.randn(2, 30, 16, dtype=F64)
    x[1, 18:] = 1e3  # garbage in the padding must not matter
    out = mod(x, pad_mask([30, 18], 30))
    assert torch.allclose(out[1, :18], mod(x[1:, :18])[0], atol=1e-12)
    with pytest.raises(ValueError, match="max_seq_len=40"):
        mod(torch.randn(1, 41, 16, dtype=F64))


def test_linformer_gradient_only_reaches_used_columns():
    mod = LinformerAttention(16, heads=2, dim_head=8, max_seq_len=40, proj_len=6).double()
    mod(torch.randn(1, 25, 16, dtype=F64)).square().sum().backward()
    assert mod.e.grad[:, :25].abs().sum() > 0 and mod.f.grad[:, :25].abs().sum() > 0
    assert torch.equal(mod.e.grad[:, 25:], torch.zeros(6, 15, dtype=F64))


# ---------------------------------------------------------------- Longformer
def band_ref(q, k, v, window, mask):
    n = q.shape[2]
    i = torch.arange(n)
    allowed = ((i[:, None] - i[None, :]).abs() <= window // 2)[None, None]  # (1, 1, n, n) dense band
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    s = (q @ k.mT / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize(("n", "window"), [(1, 3), (5, 3), (37, 9), (64, 33), (100, 1), (70, 257)])
@pytest.mark.parametrize("masked", [False, True])
def test_longformer_matches_dense_band_reference(n, window, masked):
    q, k, v = qkv(n=n)
    mask = pad_mask([n, max(1, n // 2)], n) if masked else None
    out = sliding_window_attention(q, k, v, window_size=window, mask=mask)
    ref = band_ref(q, k, v, window, mask)
    real = torch.ones(2, n, dtype=torch.bool) if mask is None else mask
    assert torch.isfinite(out).all()
    assert torch.allclose(out.transpose(1, 2)[real], ref.transpose(1, 2)[real], atol=1e-12)


def test_longformer_wide_window_is_softmax_and_bad_window_raises():
    q, k, v = qkv(n=20)
    out = sliding_window_attention(q, k, v, window_size=39, mask=pad_mask([20, 9], 20))
    ref = softmax_oracle(q, k, v, pad_mask([20, 9], 20))
    assert torch.allclose(out[0], ref[0], atol=1e-12) and torch.allclose(
        out[1, :, :9], ref[1, :, :9], atol=1e-12
    )
    with pytest.raises(ValueError, match="window_size must be odd"):
        sliding_window_attention(q, k, v, window_size=8)
    with pytest.raises(ValueError, match="window_size"):
        LongformerAttention(16, window_size=0)


def test_longformer_end_padding_equals_short_run():
    mod = LongformerAttention(16, heads=2, dim_head=8, window_size=7).double()
    x = torch.randn(2, 45, 16, dtype=F64)
    x[1, 23:] = -1e3
    out = mod(x, pad_mask([45, 23], 45))
    assert torch.allclose(out[1, :23], mod(x[1:, :23])[0], atol=1e-12)


# ---------------------------------------------------------------- Performer
def test_favor_features_formula_exact():
    x = 0.7 * torch.randn(2, 2, 5, 4, dtype=F64)
    w = torch.randn(6, 4, dtype=F64)
    plain = favor_features(x, w, kind="plain")
    for idx in [(0, 0, 0, 0), (1, 1, 4, 5), (0, 1, 2, 3)]:
        b, h, i, j = idx
        xi = x[b, h, i]
        expect = math.exp(
            sum(w[j, t].item() * xi[t].item() for t in range(4)) - 0.5 * sum(xi.square().tolist())
        )
        assert plain[idx].item() == pytest.approx(expect / math.sqrt(6), rel=1e-13)
    # stabilised kinds differ from the formula by one constant per query row / per (b, h) for keys
    ratio_q = favor_features(x, w, kind="query") / plain  # (b, h, n, m)
    assert torch.allclose(ratio_q, ratio_q[..., :1].expand_as(ratio_q), rtol=1e-12)
    row_max = favor_features(x, w, kind="query").amax(-1)  # the shift puts each row max at 1/sqrt(m)
    assert torch.allclose(row_max, torch.full_like(row_max, 1 / math.sqrt(6)), rtol=1e-14)
    mask = pad_mask([5, 3], 5)
    key = favor_features(x, w, kind="key", mask=mask)
    assert torch.equal(key[1, :, 3:], torch.zeros(2, 2, 6, dtype=F64))
    ratio_k = (key / plain)[0].flatten(1)  # (h, n*m)
    assert torch.allclose(ratio_k, ratio_k[:, :1].expand_as(ratio_k), rtol=1e-12)


def test_orthogonal_random_features_blocks_and_seed():
    w = orthogonal_random_features(40, 16, generator=torch.Generator().manual_seed(3)).double()  # 3 blocks
    assert w.shape == (40, 16)
    for blk in (w[:16], w[16:32], w[32:]):
        u = blk / blk.norm(dim=1, keepdim=True)
        assert torch.allclose(u @ u.T, torch.eye(len(blk), dtype=F64), atol=1e-6)
    lengths = orthogonal_random_features(4096, 16, generator=torch.Generator().manual_seed(0)).norm(dim=1)
    assert lengths.square().mean().item() == pytest.approx(16, rel=0.05)  # chi(16): E|w|^2 = d
    again = orthogonal_random_features(40, 16, generator=torch.Generator().manual_seed(3)).double()
    assert torch.equal(w, again)


def test_performer_converges_to_softmax():
    # |x|^2 ~ 1 after the d^-1/4 scaling keeps the estimator's variance moderate. Measured (3 seeds):
    # rel. error 0.20-0.24 at m=64, 0.06-0.09 at m=1024, 0.018-0.022 at m=2^14.
    q, k, v = qkv(b=1, h=2, n=32, d=16, amp=0.5)
    ref = softmax_oracle(q, k, v)
    errs = {}
    for m in (64, 2**14):
        w = orthogonal_random_features(m, 16, generator=torch.Generator().manual_seed(0)).double()
        errs[m] = rel(performer_attention(q, k, v, w), ref)
    assert errs[2**14] < 0.04 and errs[2**14] < errs[64] / 4


def test_performer_end_padding_equals_short_run_and_redraw():
    mod = PerformerAttention(16, heads=2, dim_head=8, num_features=24).double()
    x = torch.randn(2, 30, 16, dtype=F64)
    x[1, 11:] = 50.0
    out = mod(x, pad_mask([30, 11], 30))
    assert torch.allclose(out[1, :11], mod(x[1:, :11])[0], atol=1e-12)
    assert torch.equal(
        mod.projection, PerformerAttention(16, heads=2, dim_head=8, num_features=24).projection.double()
    )
    before = mod.projection.clone()
    mod.redraw_projection(seed=1)
    assert mod.projection.dtype == F64 and not torch.allclose(mod.projection, before)
    assert not torch.allclose(mod(x), out)
    assert "projection" in mod.state_dict()


# ---------------------------------------------------------------- Reformer
def lsh_ref(qk, v, rot, c, mask):
    """Loops over (b, h, round, query): bucket, sort, chunk + previous chunk rule, log-sum-exp mix."""
    b, h, n, d = qk.shape
    r, u = rot.shape[0], 2 * rot.shape[2]
    nc = -(-n // c)
    n_pad = nc * c
    qk = torch.cat((qk, torch.zeros(b, h, n_pad - n, d, dtype=F64)), 2)
    v = torch.cat((v, torch.zeros(b, h, n_pad - n, v.shape[-1], dtype=F64)), 2)
    real = [[t < n and (mask is None or bool(mask[i, t])) for t in range(n_pad)] for i in range(b)]
    out = torch.zeros(b, h, n, v.shape[-1], dtype=F64)
    for i in range(b):
        for j in range(h):
            outs, lses = [], []
            for rr in range(r):
                proj = [qk[i, j, t] @ rot[rr] for t in range(n_pad)]
                bucket = [int(torch.cat((p, -p)).argmax()) if real[i][t] else u for t, p in enumerate(proj)]
                order = sorted(range(n_pad), key=lambda t: (bucket[t], t))
                chunk_of = {t: rank // c for rank, t in enumerate(order)}
                members = [order[z * c : (z + 1) * c] for z in range(nc)]
                o_r, l_r = torch.zeros(n, v.shape[-1], dtype=F64), torch.zeros(n, dtype=F64)
                for t in range(n):
                    z = chunk_of[t]
                    keys = members[z] + members[(z - 1) % nc]  # a list: duplicates count twice
                    logits = []
                    for s in keys:
                        key = qk[i, j, s] / qk[i, j, s].norm().clamp_min(1e-12)
                        val = (qk[i, j, t] @ key).item() / math.sqrt(d)
                        val = SELF_LOGIT if s == t else val
                        logits.append(val if real[i][s] else torch.finfo(F64).min)
                    lg = torch.tensor(logits, dtype=F64)
                    l_r[t] = torch.logsumexp(lg, 0)
                    o_r[t] = torch.exp(lg - l_r[t]) @ v[i, j, keys]
                outs.append(o_r)
                lses.append(l_r)
            wts = torch.softmax(torch.stack(lses), 0)  # (r, n)
            out[i, j] = sum(wts[rr, :, None] * outs[rr] for rr in range(r))
    return out


@pytest.mark.parametrize(("n", "c", "masked"), [(20, 4, False), (19, 4, True), (9, 3, True), (6, 8, False)])
def test_reformer_matches_loop_reference(n, c, masked):
    qk, _, v = qkv(b=2, h=2, n=n, d=6)
    rot = random_rotations(2, 6, lsh_num_buckets(n, c), generator=torch.Generator().manual_seed(5)).double()
    mask = pad_mask([n, n // 2], n) if masked else None
    out = lsh_attention(qk, v, rot, bucket_size=c, mask=mask)
    ref = lsh_ref(qk, v, rot, c, mask)
    real = torch.ones(2, n, dtype=torch.bool) if mask is None else mask
    assert torch.allclose(out.transpose(1, 2)[real], ref.transpose(1, 2)[real], atol=1e-12)


def test_reformer_one_chunk_is_softmax_without_self():
    qk, _, v = qkv(n=10)
    rot = random_rotations(3, 8, 2).double()
    key = qk / qk.norm(dim=-1, keepdim=True)
    s = (qk @ key.mT / math.sqrt(8)).masked_fill(torch.eye(10, dtype=torch.bool), -math.inf)
    out = lsh_attention(qk, v, rot, bucket_size=16)
    assert torch.allclose(out, torch.softmax(s, -1) @ v, atol=1e-12)


def test_reformer_self_only_when_alone_and_shared_qk():
    qk, _, v = qkv(b=1, h=2, n=7)
    rot = random_rotations(2, 8, lsh_num_buckets(7, 4)).double()
    out = lsh_attention(qk, v, rot, bucket_size=4, mask=pad_mask([1], 7))
    assert torch.allclose(out[0, :, 0], v[0, :, 0], atol=1e-12)  # only itself is real
    mod = ReformerAttention(16, heads=2, dim_head=8, bucket_size=4).double()
    x = torch.randn(1, 13, 16, dtype=F64)
    y = mod(x)
    with torch.no_grad():
        mod.qkv.weight[16:32] += 1.0  # the k block: unused by shared-QK attention
    assert torch.equal(mod(x), y)
    redrawn = ReformerAttention(16, heads=2, dim_head=8, bucket_size=4, seed=None).double()
    redrawn.load_state_dict(mod.state_dict())
    assert not torch.allclose(redrawn(x), redrawn(x))  # seed=None: fresh rotations on every call


def test_reformer_padding_content_is_ignored_and_bad_options_raise():
    mod = ReformerAttention(16, heads=2, dim_head=8, bucket_size=4).double()
    x = torch.randn(2, 22, 16, dtype=F64)
    mask = pad_mask([22, 13], 22)
    y = mod(x, mask)
    x[1, 13:] = torch.randn(9, 16, dtype=F64) * 100
    assert torch.allclose(mod(x, mask)[1, :13], y[1, :13], atol=1e-12)
    with pytest.raises(ValueError, match="bucket_size"):
        ReformerAttention(16, bucket_size=0)
    with pytest.raises(ValueError, match="rotations"):
        lsh_attention(*qkv()[:2], torch.zeros(2, 5, 3))


# ---------------------------------------------------------------- gradients of the in-place tricks
@pytest.mark.parametrize("variant", ["linear", "linformer", "longformer", "performer", "reformer"])
def test_gradcheck(variant):
    q, k, v = (t.requires_grad_(True) for t in qkv(b=2, h=1, n=9, d=4))
    mask = pad_mask([9, 6], 9)
    e, f = torch.randn(2, 5, 9, dtype=F64).unbind(0)
    w = torch.randn(7, 4, dtype=F64)
    rot = random_rotations(2, 4, lsh_num_buckets(9, 3), generator=torch.Generator().manual_seed(0)).double()
    fn = {
        "linear": lambda q, k, v: linear_attention(q, k, v, mask=mask),
        "linformer": lambda q, k, v: linformer_attention(q, k, v, e, f, mask=mask),
        "longformer": lambda q, k, v: sliding_window_attention(q, k, v, window_size=3, mask=mask),
        "performer": lambda q, k, v: performer_attention(q, k, v, w, mask=mask),
        "reformer": lambda q, k, v: lsh_attention(q, v, rot, bucket_size=3, mask=mask),
    }[variant]
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7)
