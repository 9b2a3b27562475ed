"""Packed documents (``cu_seqlens``): every document of a packed row gets exactly what it gets alone, on
every path (CPU, accelerator path, traceable, fused kernels under Triton's interpreter), with padding
inside and after documents, in float64 and float32, forward and gradients; and bad offsets raise."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nystrom import NystromAttention, SoftmaxAttention, nystrom_attention
from nystrom.attention import REGISTRY
from nystrom.ops.nystrom import fused
from nystrom.ops.nystrom.fused import LAUNCHES, fused_kernels
from nystrom.ops.plan import (
    cu_seqlens_from_document_ids,
    document_ids_from_positions,
    documents,
    shared_plan,
    split_documents,
    to_documents,
)
from nystrom.ops.softmax import softmax_attention
from nystrom.utils.device import force_accelerator_path

from oracle import DispatchedOps, rel_err

#: relative error allowed, packed against separate: outputs, gradients
TOLERANCE = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-5, 1e-4)}


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def _inputs(b, h, n, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def _separate(fn, q, k, v, cu, mask, n):
    """Each document alone (its own call, its own rows), stitched back: the answer a packed row must give."""
    out = torch.zeros(q.shape[0] * n, q.shape[1], v.shape[-1], dtype=q.dtype)
    rows = lambda t: t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[-1])  # noqa: E731  (b·n, h, d)
    qr, kr, vr = rows(q), rows(k), rows(v)
    flat = None if mask is None else mask.reshape(-1)
    pieces = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        doc = [t[s:e].transpose(0, 1)[None] for t in (qr, kr, vr)]  # (1, h, L, d)
        dmask = None if flat is None else flat[s:e][None]
        pieces.append((s, e, fn(*doc, dmask)[0].transpose(0, 1)))
    out = torch.cat([p for _, _, p in pieces])  # (b·n, h, dv), documents in order
    return out.view(q.shape[0], n, q.shape[1], -1).transpose(1, 2)


def _check(fn, q, k, v, cu, mask, dtype):
    n = q.shape[2]
    packed = fn(q, k, v, mask, cu)
    alone = _separate(lambda *a: fn(*a, None), q, k, v, cu, mask, n)
    real = torch.ones(q.shape[0], n, dtype=torch.bool) if mask is None else mask
    sel = lambda t: t.transpose(1, 2)[real]  # noqa: E731  real rows only: padded rows are unspecified
    out_tol, grad_tol = TOLERANCE[dtype]
    assert rel_err(sel(packed), sel(alone)) <= out_tol
    w = torch.randn(packed.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    w = w * real[:, None, :, None]
    got = torch.autograd.grad((packed * w).sum(), (q, k, v))
    want = torch.autograd.grad((alone * w).sum(), (q, k, v))
    # relative to the loss's largest gradient: a row of one token has ∂q = ∂k = 0 exactly, whose rounding
    # noise no relative error of its own can judge
    scale = max(float(sel(g).double().norm()) for g in want)
    for g1, g2 in zip(got, want):
        assert float((sel(g1) - sel(g2)).double().norm()) <= grad_tol * scale


def _nystrom(m, conv=None):
    def fn(q, k, v, mask, cu):
        return nystrom_attention(q, k, v, num_landmarks=m, mask=mask, cu_seqlens=cu, conv_weight=conv)

    return fn


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 200), min_size=1, max_size=16),
    m=st.sampled_from([1, 4, 16]),
    pad=st.integers(0, 5),
    path=st.sampled_from(["cpu", "accelerator"]),
)
def test_packed_row_equals_documents_alone_float64(lengths, m, pad, path):
    """1–16 documents of 1–200 tokens (shorter and longer than m), a padded tail inside the last document,
    NaN at the padding: ≤ 1e-10 on the CPU and the accelerator path, forward and gradients."""
    lengths = [*lengths[:-1], lengths[-1] + pad]
    n = sum(lengths)
    q, k, v = _inputs(1, 2, n, 8, torch.float64)
    mask = None
    if pad and lengths[-1] > pad:  # the padding stays inside the last document, which keeps a real token
        mask = torch.ones(1, n, dtype=torch.bool)
        mask[0, n - pad :] = False
        with torch.no_grad():
            for t in (q, k, v):
                t[:, :, n - pad :] = float("nan")
    conv = torch.randn(2, 1, 5, 1, dtype=torch.float64)
    with force_accelerator_path() if path == "accelerator" else contextlib.nullcontext():
        _check(_nystrom(m, conv), q, k, v, _offsets(lengths), mask, torch.float64)


@pytest.mark.parametrize("path", ["cpu", "accelerator"])
def test_packed_rows_in_a_batch_float32_with_holes(path):
    """b = 3 rows, each starting a document, padding inside documents (holes) and after them: float32
    within 1e-5 (outputs) and 1e-4 (gradients)."""
    n = 96
    lengths = [[40, 3, 53], [96], [1, 1, 64, 30]]
    cu = _offsets([x for row in lengths for x in row])
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[0, 10:15] = False  # a hole inside the first document
    mask[2, 90:] = False  # the tail of the last document
    q, k, v = _inputs(3, 2, n, 16, torch.float32)
    with force_accelerator_path() if path == "accelerator" else contextlib.nullcontext():
        _check(_nystrom(8), q, k, v, cu, mask, torch.float32)


def test_packed_long_documents_float32():
    """Documents up to 4096 tokens, above and below m = 64, MiniLM's head size."""
    lengths = [4096, 700, 13, 2000]
    q, k, v = _inputs(1, 2, sum(lengths), 32, torch.float32)
    _check(_nystrom(64), q, k, v, _offsets(lengths), None, torch.float32)


def test_packed_under_compile():
    """The traceable path (torch.compile) with max_seqlen given: the documents' answers."""
    lengths = [30, 5, 61]
    cu = _offsets(lengths)
    q, k, v = _inputs(1, 2, sum(lengths), 8, torch.float32)
    compiled = torch.compile(
        lambda q, k, v, mask, cu: nystrom_attention(q, k, v, num_landmarks=8, cu_seqlens=cu, max_seqlen=61),
        fullgraph=True,
    )
    packed = compiled(q, k, v, None, cu)
    alone = _separate(
        lambda q, k, v, mask: nystrom_attention(q, k, v, num_landmarks=8), q, k, v, cu, None, 96
    )
    assert rel_err(packed, alone) <= 1e-5


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_packed_fused_kernels_interpreted():
    """The fused kernels (Triton's interpreter) take the documents as samples: the documents' answers, and
    the fused op's launches per call are those of one unpacked call."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the gpu-marked tests run the kernels there")
    lengths = [20, 3, 41]
    cu = _offsets(lengths)
    q, k, v = _inputs(1, 2, sum(lengths), 16, torch.float32)
    conv = torch.randn(2, 1, 3, 1)
    with fused_kernels(True):
        assert fused.covers(q, v, num_landmarks=8, pinv="iterative", pinv_init="per_matrix")
        before = LAUNCHES.copy()
        nystrom_attention(q.detach(), k.detach(), v.detach(), num_landmarks=8, cu_seqlens=cu)
        packed_launches = LAUNCHES - before
        before = LAUNCHES.copy()
        nystrom_attention(q.detach(), k.detach(), v.detach(), num_landmarks=8)
        assert packed_launches == LAUNCHES - before  # one call's kernels, whatever the documents
        _check(_nystrom(8, conv), q, k, v, cu, None, torch.float32)


@pytest.mark.gpu
def test_packed_fused_kernels_on_cuda():
    """On CUDA at real sizes (bf16, MiniLM's head, m = 64): the documents' answers through the fused
    kernels, every document a sample in its own span of the row (the launches of one call), forward and
    the gradients against each document alone."""
    lengths = [1000, 17, 3000, 80]
    cu = _offsets(lengths).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(1, 4, sum(lengths), 64, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(3)
    )
    with fused_kernels(True):
        assert fused.covers(q, v, num_landmarks=64, pinv="iterative", pinv_init="per_matrix")
        before = LAUNCHES.copy()
        packed = nystrom_attention(q, k, v, cu_seqlens=cu)
        packed_launches = LAUNCHES - before
        before = LAUNCHES.copy()
        nystrom_attention(q, k, v)
        assert packed_launches == LAUNCHES - before
        alone = torch.cat(
            [nystrom_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e]) for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())], 2
        )  # fmt: skip
    assert rel_err(packed, alone) <= 2e-2  # bf16 rounding, different splits over n
    for t in (q, k, v):
        t.requires_grad_()
    w = torch.randn(packed.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    with fused_kernels(True):
        got = torch.autograd.grad((nystrom_attention(q, k, v, cu_seqlens=cu) * w).float().sum(), (q, k, v))
        bounds = list(zip(cu[:-1].tolist(), cu[1:].tolist()))
        alone = torch.cat([nystrom_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e]) for s, e in bounds], 2)
        want = torch.autograd.grad((alone * w).float().sum(), (q, k, v))
    for g1, g2 in zip(got, want):
        assert rel_err(g1, g2) <= 5e-2  # bf16 gradients, different split sums


@pytest.mark.parametrize("block_size", [None, 4])
def test_softmax_attention_packs(block_size):
    """Exact softmax attention packs the same way (the long recipe's local layers and the exact baseline),
    as the op and as the module (block-diagonal windows restart with every document)."""
    lengths = [9, 1, 22]
    cu = _offsets(lengths)
    q, k, v = _inputs(1, 2, 32, 8, torch.float64)
    _check(lambda q, k, v, mask, cu: softmax_attention(q, k, v, mask=mask, cu_seqlens=cu), q, k, v, cu, None,
           torch.float64)  # fmt: skip
    mod = SoftmaxAttention(16, heads=2, dim_head=8, block_size=block_size).double()
    x = torch.randn(1, 32, 16, dtype=torch.float64)
    alone = torch.cat([mod(x[:, s:e]) for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())], 1)
    assert rel_err(mod(x, cu_seqlens=cu), alone) <= 1e-12


def test_module_with_recompute_packs():
    """recompute=True rebuilds q/k/v head by head in the backward: the documents' answers and gradients
    through it too, with documents in three groups of unlike lengths."""
    cu = _offsets([300, 7, 1, 40, 600])
    torch.manual_seed(0)
    mod = NystromAttention(
        16, heads=2, dim_head=8, num_landmarks=8, conv_kernel_size=5, recompute=True
    ).double()
    x = torch.randn(1, 948, 16, dtype=torch.float64, requires_grad=True)
    pieces = zip(cu[:-1].tolist(), cu[1:].tolist())
    alone = torch.cat([mod(x[:, s:e]) for s, e in pieces], 1)
    packed = mod(x, cu_seqlens=cu)
    assert rel_err(packed, alone) <= 1e-12
    w = torch.randn_like(alone)
    params = [x, *mod.parameters()]
    for g1, g2 in zip(
        torch.autograd.grad((packed * w).sum(), params), torch.autograd.grad((alone * w).sum(), params)
    ):
        assert rel_err(g1, g2) <= 1e-10


def test_sliding_window_attention_packs():
    """Longformer's windows (the long recipe's local layers) stop at a document's end as they do alone."""
    cu = _offsets([5, 1, 40, 18])
    mod = REGISTRY["longformer"](16, heads=2, dim_head=8, window_size=9).double()
    x = torch.randn(1, 64, 16, dtype=torch.float64)
    alone = torch.cat([mod(x[:, s:e]) for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())], 1)
    assert rel_err(mod(x, cu_seqlens=cu), alone) <= 1e-12


def test_modules_without_exact_padding_refuse_packing():
    """A variant whose output depends on the padded length (Linformer's projection over n) cannot give a
    document what it gets alone: it raises instead of mixing."""
    mod = REGISTRY["linformer"](16, heads=2, dim_head=8, max_seq_len=32, proj_len=8)
    with pytest.raises(ValueError, match="cannot honour packed documents"):
        mod(torch.randn(1, 32, 16), cu_seqlens=_offsets([10, 22]))


def test_the_documents_plan_is_computed_once_per_block(monkeypatch):
    """Inside one shared_plan block (a model's forward), every layer reuses the documents' plan."""
    calls = []
    plan = documents.document_plan
    monkeypatch.setattr(documents, "document_plan", lambda *a, **kw: calls.append(1) or plan(*a, **kw))
    mod = NystromAttention(16, heads=2, dim_head=8, num_landmarks=4)
    x = torch.randn(1, 32, 16)
    cu = _offsets([10, 22])
    with shared_plan(None, cu):
        for _ in range(3):
            mod(x, cu_seqlens=cu)
    assert len(calls) == 1
    mod(x, cu_seqlens=cu)  # outside a block: its own
    assert len(calls) == 2


def test_document_ids_from_positions():
    """transformers' rule (a position id that is not the previous + 1 starts a document), padding never
    starting one (left padding's repeated ids, right padding's arbitrary ids), every row starting one."""
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 0, 0, 1, 2, 3, 0, 1, 5]])
    mask = torch.tensor([[1] * 9, [0, 0, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    ids = document_ids_from_positions(pos, mask)
    assert ids.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2], [0, 0, 0, 0, 0, 0, 1, 1, 1]]
    assert cu_seqlens_from_document_ids(ids).tolist() == [0, 3, 5, 9, 15, 18]


@pytest.mark.parametrize(
    ("offsets", "match"),
    [
        ([1, 10, 20], "run from 0 to batch × tokens"),
        ([0, 10, 19], "run from 0 to batch × tokens"),
        ([0, 10, 10, 20], "increase strictly: document 1"),
        ([0, 15, 5, 20], "increase strictly: document 1"),
    ],
)
def test_bad_offsets_raise(offsets, match):
    q = torch.randn(1, 2, 20, 8)
    with pytest.raises(ValueError, match=match):
        nystrom_attention(q, q, q, num_landmarks=4, cu_seqlens=torch.tensor(offsets, dtype=torch.int32))


def test_other_misuse_raises():
    q = torch.randn(2, 2, 10, 8)
    cu = torch.tensor([0, 15, 20], dtype=torch.int32)
    with pytest.raises(ValueError, match="document 0 .* runs from row 0 into row 1"):
        nystrom_attention(q, q, q, num_landmarks=4, cu_seqlens=cu)
    cu = torch.tensor([0, 4, 10, 20], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_seqlen=5 is shorter than document 2"):
        nystrom_attention(q, q, q, num_landmarks=4, cu_seqlens=cu, max_seqlen=5)
    with pytest.raises(ValueError, match="give it with cu_seqlens"):
        nystrom_attention(q, q, q, num_landmarks=4, max_seqlen=5)
    with pytest.raises(TypeError, match="int32"):
        nystrom_attention(q, q, q, num_landmarks=4, cu_seqlens=cu.float())
    with pytest.raises(ValueError, match="segments='front_padded'"):
        nystrom_attention(q, q, q, num_landmarks=4, cu_seqlens=cu, segments="front_padded")
    with pytest.raises(ValueError, match="pinv_init='original'"):
        nystrom_attention(q, q, q, num_landmarks=4, cu_seqlens=cu, pinv_init="original")
    with pytest.raises(ValueError, match="cannot honour packed documents"):
        NystromAttention(16, heads=2, dim_head=8, pinv_init="original")(torch.randn(2, 10, 16), cu_seqlens=cu)
    with pytest.raises(ValueError, match="causal=True is not supported"):
        nystrom_attention(q, q, q, num_landmarks=4, cu_seqlens=cu, causal=True)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, :4] = False  # document 0 is all padding
    with pytest.raises(ValueError, match="document 0 .* has no real token"):
        nystrom_attention(q, q, q, num_landmarks=4, cu_seqlens=cu, mask=mask)


def test_like_lengths_group_documents_on_the_cpu():
    """Documents of like lengths share one padded batch; an unlike one starts its own (less padding)."""
    assert documents.like_lengths([4096, 700, 13, 2000, 3900]) == [[0, 4], [3], [1], [2]]
    assert documents.like_lengths([300, 100, 60, 50]) == [
        [0, 1, 2, 3]
    ]  # within GROUP_SLACK tokens: one batch
    cu = _offsets([4096, 700, 13, 2000, 3900])
    q = torch.zeros(1, 1, int(cu[-1]), 4)
    plan = documents.packed_plan(cu, None, 1, q.shape[2], q.device)
    assert [(g.mask.shape[0], g.length) for g in plan.groups] == [(2, 4096), (1, 2000), (1, 700), (1, 13)]
    # consecutive documents of one length are slices of the row, and groups of them need no gather back
    plan = documents.packed_plan(_offsets([2600, 1496]), None, 1, 4096, q.device)
    assert plan.in_order and [(g.start, g.length) for g in plan.groups] == [(0, 2600), (2600, 1496)]
    plan = documents.packed_plan(_offsets([1024] * 4), None, 1, 4096, q.device)
    assert plan.in_order and [(g.start, g.mask.shape[0]) for g in plan.groups] == [(0, 4)]


def test_groups_in_order_are_split_once_and_their_gradient_is_one_cat():
    """Slices of the row in order are one split: the backward concatenates the groups' gradients instead of
    zero-filling all N rows once per group (a narrow's backward), and gives the same values."""
    cu = _offsets([600, 300, 300])  # unlike lengths (beyond GROUP_SLACK): two groups
    x = torch.randn(1, 3, 1200, 4, dtype=torch.float64, requires_grad=True)
    plan = documents.packed_plan(cu, None, 1, 1200, x.device)
    assert plan.in_order and [(g.start, g.mask.shape[0], g.length) for g in plan.groups] == [
        (0, 1, 600),
        (600, 2, 300),
    ]
    parts = split_documents(x, plan)
    for part, group in zip(parts, plan.groups):
        assert torch.equal(part, to_documents(x, group))  # (G, h, L, d)
    weights = [torch.randn_like(p) for p in parts]
    with DispatchedOps() as seen:
        (gx,) = torch.autograd.grad(sum((p * w).sum() for p, w in zip(parts, weights)), x)
    assert "slice_backward" not in seen.names and "fill_" not in seen.names, seen.names
    (ref,) = torch.autograd.grad(sum((to_documents(x, g) * w).sum() for g, w in zip(plan.groups, weights)), x)
    torch.testing.assert_close(gx, ref, rtol=0, atol=0)


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 4096), min_size=1, max_size=16),
    path=st.sampled_from(["cpu", "accelerator"]),
)
def test_packed_rows_of_documents_up_to_4096_tokens_float32(lengths, path):
    """The issue's range in float32: 1–16 documents of 1–4096 tokens, m = 64, the module's conv skip."""
    q, k, v = _inputs(1, 2, sum(lengths), 16, torch.float32)
    conv = torch.randn(2, 1, 33, 1)
    with force_accelerator_path() if path == "accelerator" else contextlib.nullcontext():
        _check(_nystrom(64, conv), q, k, v, _offsets(lengths), None, torch.float32)
