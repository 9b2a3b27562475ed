"""The functional core against float64 oracles: landmarks, pinv, fused = materialised, exactness, gradients."""

import math

import pytest
import torch

from nystrom.functional import (
    iterative_pinv,
    long_key_attention,
    nystrom_attention,
    segment_means,
    short_key_attention,
    softmax_attention,
)
from nystrom.ops.nystrom import cpu_kernels as kernels
from nystrom.ops.nystrom.naive import nystrom_attention_materialized
from nystrom.ops.pinv.naive import reference_pinv

from oracle import DispatchedOps, landmarks_oracle, nystrom_oracle, rel_err, right_pad_mask, softmax_oracle


def qkv(b=2, h=3, n=40, d=8, dtype=torch.float64, dv=None):
    return (
        torch.randn(b, h, n, d, dtype=dtype),
        torch.randn(b, h, n, d, dtype=dtype),
        torch.randn(b, h, n, dv or d, dtype=dtype),
    )


# ---------------------------------------------------------------- landmarks
def test_segment_means_is_paper_contiguous_mean_when_m_divides_n():
    x = torch.randn(2, 3, 24, 5, dtype=torch.float64)
    lm, valid = segment_means(x, 6)
    assert torch.equal(lm, x.reshape(2, 3, 6, 4, 5).mean(3))
    assert valid.all()


@pytest.mark.parametrize("n,m", [(23, 5), (10, 3), (7, 7), (64, 10)])
def test_segment_means_uneven_matches_rank_rule(n, m):
    x = torch.randn(2, 2, n, 4, dtype=torch.float64)
    lm, valid = segment_means(x, m)
    for i, (ref, idx) in enumerate(landmarks_oracle(x, m)):
        assert idx == list(range(m))  # every landmark used when n >= m
        torch.testing.assert_close(lm[i], ref, rtol=1e-12, atol=1e-12)
    assert valid.all()


def test_segment_means_padding_never_enters_and_short_rows_mask_landmarks():
    x = torch.randn(3, 2, 12, 4, dtype=torch.float64)
    mask = right_pad_mask([12, 7, 3], 12)
    mask[0, 5] = False  # a hole in the middle: ranks skip it
    lm, valid = segment_means(x, 4, mask)
    for i, (ref, idx) in enumerate(landmarks_oracle(x, 4, mask)):
        assert valid[i].nonzero().flatten().tolist() == idx
        torch.testing.assert_close(lm[i][:, idx], ref, rtol=1e-12, atol=1e-12)
    assert valid[2].tolist() == [True, True, True, False]  # L=3 < m=4: floor(r*4/3) = 0, 1, 2
    assert valid.sum(-1).tolist() == [4, 4, 3]
    x2 = x.clone()
    x2.transpose(1, 2)[~mask] = 1e6
    assert torch.equal(segment_means(x2, 4, mask)[0], lm)


def test_segment_means_of_head_views_sums_contiguous_rows():
    # Head views of a joint (b, n, 3, h, d) projection are strided rows; index_add_ on a strided source
    # falls back to a scatter_add_ over an expanded index, 3x slower on the CPU. The sums must get a
    # contiguous source, and the means must not change.
    joint = torch.randn(2, 23, 3, 4, 5, dtype=torch.float64)  # (b, n, 3, h, d)
    x = joint[:, :, 1].transpose(1, 2)  # (b, h, n, d) head view, not contiguous
    mask = right_pad_mask([23, 17], 23)
    with DispatchedOps() as seen:
        lm, valid = segment_means(x, 6, mask)
    assert [args[3].is_contiguous() for name, args in seen.calls if name in ("index_add", "index_add_")] == [
        True
    ]
    for i, (ref, idx) in enumerate(landmarks_oracle(x, 6, mask)):
        torch.testing.assert_close(lm[i][:, idx], ref, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- pinv
def test_iterative_pinv_matches_formula_and_converges():
    a = torch.softmax(torch.randn(4, 16, 16, dtype=torch.float64), -1)
    for it in (0, 1, 6):
        z = iterative_pinv(a, it)
        ref = torch.stack([reference_pinv(ai, it, per_matrix=True) for ai in a])  # one matrix at a time
        torch.testing.assert_close(z, ref, rtol=1e-12, atol=1e-12)
    errs = [float((a @ iterative_pinv(a, it) @ a - a).norm()) for it in (1, 3, 6, 12, 25)]
    assert all(e1 > e2 for e1, e2 in zip(errs, errs[1:])), errs  # A Z A -> A improves with iterations
    assert errs[-1] < 1e-8 * float(a.norm())
    torch.testing.assert_close(iterative_pinv(a, 40), torch.linalg.pinv(a), rtol=1e-8, atol=1e-8)


def test_iterative_pinv_runs_in_float32_for_half_inputs():
    a = torch.softmax(torch.randn(2, 8, 8), -1)
    for dt in (torch.float16, torch.bfloat16):
        z = iterative_pinv(a.to(dt))
        assert z.dtype == torch.float32
        assert rel_err(z, iterative_pinv(a.to(dt).float())) < 1e-6


def test_pinv_init_original_uses_batch_wide_scale():
    a = torch.softmax(
        torch.randn(3, 8, 8, dtype=torch.float64) * torch.tensor([0.1, 1, 5.0])[:, None, None], -1
    )
    per = iterative_pinv(a, 2, "per_matrix")
    orig = iterative_pinv(a, 2, "original")
    alone = iterative_pinv(a[:1], 2, "original")
    torch.testing.assert_close(per[:1], iterative_pinv(a[:1], 2, "per_matrix"))
    assert not torch.allclose(orig[:1], alone)  # batch-mates change the result: the public codes' fault


# ---------------------------------------------------------------- attention values
@pytest.mark.parametrize("n,m", [(40, 8), (37, 5), (64, 64), (10, 16)])
def test_fused_equals_materialized_fp64(n, m, kernel_path):
    q, k, v = qkv(n=n, dv=6)
    a = nystrom_attention(q, k, v, num_landmarks=m)
    b = nystrom_attention_materialized(q, k, v, num_landmarks=m)
    assert rel_err(a, b) <= 1e-12


@pytest.fixture(params=["chunked", "sdpa"])
def kernel_path(request, monkeypatch):
    """Run a test through the CPU chunked kernels (on their thread pool) and the fused-SDPA dispatch."""
    big = 1 if request.param == "chunked" else 10**9
    if request.param == "chunked":
        request.getfixturevalue("two_threads")
    monkeypatch.setattr(kernels, "SHORT_MIN_N", big)
    monkeypatch.setattr(kernels, "LONG_MIN_N", big)
    monkeypatch.setattr(kernels, "TRAIN_MIN_N", big)
    return request.param


def test_fused_equals_materialized_fp32_with_padding_and_chunks(monkeypatch, kernel_path):
    monkeypatch.setattr(kernels, "CHUNK_ROWS", 16)  # several chunks, a ragged last one
    monkeypatch.setattr(kernels, "CHUNK_KEYS", 8)
    monkeypatch.setattr(kernels, "SPLITS", 2)
    q, k, v = qkv(n=50, dtype=torch.float32)
    mask = right_pad_mask([50, 31], 50)
    a = nystrom_attention(q, k, v, num_landmarks=8, mask=mask)
    b = nystrom_attention_materialized(q, k, v, num_landmarks=8, mask=mask)
    real = mask[:, None, :, None].expand_as(a)
    assert rel_err(a[real], b[real]) <= 1e-5


@pytest.mark.parametrize("pinv", ["exact", "iterative"])
def test_matches_float64_oracle_with_padding(pinv, kernel_path):
    q, k, v = qkv(b=3, n=30)
    mask = right_pad_mask([30, 17, 5], 30)
    out = nystrom_attention(q, k, v, num_landmarks=8, mask=mask, pinv=pinv)
    ref = nystrom_oracle(q, k, v, 8, mask, pinv=pinv)
    for i, L in enumerate([30, 17, 5]):
        assert rel_err(out[i, :, :L], ref[i, :, :L]) <= 1e-10


@pytest.mark.parametrize("n", [1, 9, 32])
def test_m_equals_n_exact_pinv_is_softmax_attention(n):
    # Through the Nyström code path (landmarks, A, pinv, both kernels), not a shortcut.
    q, k, v = qkv(n=n)
    out = nystrom_attention(q, k, v, num_landmarks=n, pinv="exact")
    assert rel_err(out, softmax_oracle(q, k, v)) <= 1e-10
    assert rel_err(softmax_attention(q, k, v), softmax_oracle(q, k, v)) <= 1e-12


def test_m_equals_real_length_under_padding_is_softmax_attention():
    q, k, v = qkv(b=2, n=20)
    mask = right_pad_mask([20, 12], 20)
    out = nystrom_attention(q, k, v, num_landmarks=20, mask=mask, pinv="exact")
    ref = softmax_oracle(q, k, v, mask)
    assert rel_err(out[0], ref[0]) <= 1e-10
    assert rel_err(out[1, :, :12], ref[1, :, :12]) <= 1e-10


def test_more_landmarks_approximate_better_and_iteration_regularises():
    torch.manual_seed(1)
    u = torch.randn(1, 2, 256, 4, dtype=torch.float64)  # rank-4 structure, not i.i.d. noise
    q = u @ torch.randn(4, 16, dtype=torch.float64) * 0.5
    k = u @ torch.randn(4, 16, dtype=torch.float64) * 0.5
    v = torch.randn(1, 2, 256, 16, dtype=torch.float64)
    ref = softmax_oracle(q, k, v)
    errs = [rel_err(nystrom_attention(q, k, v, num_landmarks=m), ref) for m in (4, 16, 64, 256)]
    assert errs[0] > errs[1] > errs[2] > errs[3], errs  # measured: 0.78, 0.65, 0.45, 0.04
    assert errs[3] < 0.1
    # A is ill-conditioned here: the exact pseudo-inverse amplifies noise (measured 0.76 vs 0.45 at m=64),
    # the 6-step iteration does not. This is why "iterative" is the default.
    exact = rel_err(nystrom_attention(q, k, v, num_landmarks=64, pinv="exact"), ref)
    assert exact > 1.5 * errs[2], (exact, errs)


# ---------------------------------------------------------------- gradients
def test_gradcheck_fused_path(kernel_path):
    q, k, v = (t.requires_grad_() for t in qkv(b=1, h=2, n=9, d=3))
    mask = right_pad_mask([7], 9)

    def f(q, k, v):
        return nystrom_attention(q, k, v, num_landmarks=4, mask=mask)

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("splits", [1, 2])
def test_gradcheck_short_key_kernel(monkeypatch, kernel_path, splits):
    monkeypatch.setattr(kernels, "CHUNK_ROWS", 4)  # row ranges of 5 (splits=2): chunks of 4 and 1
    monkeypatch.setattr(kernels, "SPLITS", splits)
    q = torch.randn(2, 2, 10, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    valid = torch.tensor([[True] * 4, [True, True, False, True]])
    assert torch.autograd.gradcheck(
        lambda q, k, v: short_key_attention(q, k, v, valid=valid, scale=0.7), (q, k, v)
    )


@pytest.mark.parametrize("splits", [1, 3])
def test_gradcheck_long_key_kernel(monkeypatch, kernel_path, splits):
    monkeypatch.setattr(kernels, "CHUNK_KEYS", 4)  # several chunks, a fully padded one, a ragged last one
    monkeypatch.setattr(kernels, "SPLITS", splits)  # 3: key ranges of 5, the last all padding in row 1
    q = torch.randn(2, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 13, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 13, 5, dtype=torch.float64, requires_grad=True)
    mask = right_pad_mask([13, 6], 13)
    mask[0, 4:8] = False

    def f(q, k, v):
        return long_key_attention(q, k, v, key_mask=mask, scale=0.7)

    assert torch.autograd.gradcheck(f, (q, k, v))
    ref = softmax_oracle(q * 0.7 * math.sqrt(3), k, v, mask)
    assert rel_err(f(q, k, v), ref) <= 1e-12


@pytest.mark.parametrize("scale,shifted", [(0.7, False), (60.0, True)])
def test_kernels_unshifted_fast_path_and_max_shifted_fallback(monkeypatch, two_threads, scale, shifted):
    # The kernels exponentiate raw scores when every row sum stays in [2^-64, 2^64] and fall back to the
    # max-shifted softmax otherwise; at scale 60 the scores reach hundreds (exp2 overflows float32).
    monkeypatch.setattr(kernels, "SHORT_MIN_N", 1)
    monkeypatch.setattr(kernels, "LONG_MIN_N", 1)
    monkeypatch.setattr(kernels, "TRAIN_MIN_N", 1)
    monkeypatch.setattr(kernels, "CHUNK_ROWS", 4)
    monkeypatch.setattr(kernels, "CHUNK_KEYS", 4)
    calls = {"short": 0, "long": 0}
    softmax2, long_forward = kernels._softmax2_, kernels._long_forward

    def spy_softmax2(*args):
        calls["short"] += 1
        return softmax2(*args)

    def spy_long(*args, shifted):
        calls["long"] += shifted
        return long_forward(*args, shifted=shifted)

    monkeypatch.setattr(kernels, "_softmax2_", spy_softmax2)
    monkeypatch.setattr(kernels, "_long_forward", spy_long)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 3) for n in (10, 10, 10))
    lm = torch.randn(2, 2, 4, 3)
    valid = torch.tensor([[True] * 4, [True, True, False, True]])
    mask = right_pad_mask([10, 6], 10)
    root_d = math.sqrt(3)
    short = short_key_attention(q, lm, v[:, :, :4], valid=valid, scale=scale)
    assert rel_err(short, softmax_oracle(q * scale * root_d, lm, v[:, :, :4], valid)) <= 1e-5
    long = long_key_attention(lm, k, v, key_mask=mask, scale=scale)
    assert rel_err(long, softmax_oracle(lm * scale * root_d, k, v, mask)) <= 1e-5
    assert (calls["short"] > 0, calls["long"] > 0) == (shifted, shifted), calls


def test_gradcheck_kernels_through_the_max_shifted_path(monkeypatch, two_threads):
    monkeypatch.setattr(kernels, "SHORT_MIN_N", 1)
    monkeypatch.setattr(kernels, "LONG_MIN_N", 1)
    monkeypatch.setattr(kernels, "TRAIN_MIN_N", 1)
    monkeypatch.setattr(kernels, "_sums_in_range", lambda tot: False)  # force the fallback everywhere
    q = torch.randn(1, 2, 6, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 6, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 6, 4, dtype=torch.float64, requires_grad=True)
    mask = right_pad_mask([5], 6)
    assert torch.autograd.gradcheck(lambda q, k, v: short_key_attention(q, k, v, scale=0.9), (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: long_key_attention(q, k, v, key_mask=mask, scale=0.9), (q, k, v)
    )


def test_fused_gradients_match_materialized_fp32():
    q, k, v = (t.requires_grad_() for t in qkv(n=70, dtype=torch.float32))
    g = torch.randn(2, 3, 70, 8)
    grads = []
    for fn in (nystrom_attention, nystrom_attention_materialized):
        out = fn(q, k, v, num_landmarks=8)
        grads.append(torch.autograd.grad(out, (q, k, v), g))
    for a, b in zip(*grads):
        assert rel_err(a, b) <= 1e-4


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(num_landmarks=0), ValueError, "num_landmarks"),
        (dict(pinv="svd"), ValueError, "pinv"),
        (dict(pinv_init="batch"), ValueError, "pinv_init"),
        (dict(pinv_iterations=-1), ValueError, "pinv_iterations"),
        (dict(causal=True), ValueError, "bidirectional"),
        (dict(mask=torch.ones(2, 40)), TypeError, "torch.bool"),
        (dict(mask=torch.ones(2, 39, dtype=torch.bool)), ValueError, r"\(2, 40\)"),
        (dict(mask=right_pad_mask([40, 0], 40)), ValueError, "no real token"),
        (dict(scale=-1.0), ValueError, "scale"),
    ],
)
def test_bad_options_raise(kwargs, exc, match):
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(exc, match=match):
        nystrom_attention(q, k, v, **kwargs)


def test_bad_tensors_raise():
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(ValueError, match="q must have shape"):
        nystrom_attention(q[0], k, v)
    with pytest.raises(ValueError, match="same shape"):
        nystrom_attention(q, k[:, :, :10], v)
    with pytest.raises(TypeError, match="one dtype"):
        nystrom_attention(q, k.double(), v)
    with pytest.raises(TypeError, match="float16"):
        nystrom_attention(q.long(), k.long(), v.long())
    k2 = k.clone()
    k2[0, 0, 3, 0] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        nystrom_attention(q, k2, v)
    v2 = v.clone()
    v2[1, 2, 5, 1] = math.inf
    with pytest.raises(ValueError, match="NaN or Inf"):
        nystrom_attention(q, k, v2)


def test_fused_gradients_match_float64_oracle_with_padding(kernel_path):
    q, k, v = (t.requires_grad_() for t in qkv(b=2, h=2, n=21, d=4))
    mask = right_pad_mask([21, 13], 21)
    g = torch.randn(2, 2, 21, 4, dtype=torch.float64) * mask[:, None, :, None]  # real rows only
    out = nystrom_attention(q, k, v, num_landmarks=5, mask=mask)
    ref = nystrom_oracle(q, k, v, 5, mask, pinv="iterative")
    ours = torch.autograd.grad(out, (q, k, v), g)
    theirs = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(ours, theirs):
        assert rel_err(a, b) <= 1e-10


def test_softmax_attention_with_finite_padding_skips_the_zeroing_and_computes_the_same():
    from nystrom.functional import softmax_attention

    q, k, v = (torch.randn(2, 3, 20, 8, dtype=torch.float64) for _ in range(3))
    mask = torch.arange(20)[None] < torch.tensor([[20], [13]])  # (b, n): the second sample padded
    want = softmax_attention(q, k, v, mask=mask)  # padding zeroed first
    got = softmax_attention(q, k, v, mask=mask, padded_finite=True)  # finite garbage at padded keys
    real = mask[:, None, :, None].expand_as(want)
    assert torch.allclose(got[real], want[real], rtol=0, atol=1e-14)
    from nystrom.utils.device import force_accelerator_path

    with force_accelerator_path():  # where the fills are skipped (on the CPU they lay out q, k, v)
        skipped = softmax_attention(q, k, v, mask=mask, padded_finite=True)
    assert torch.allclose(skipped[real], want[real], rtol=0, atol=1e-14)
    with pytest.raises(TypeError, match="padded_finite"):
        softmax_attention(q, k, v, mask=mask, padded_finite=1)
