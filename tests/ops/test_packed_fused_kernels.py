"""Packed documents through the fused Triton kernels (Triton's interpreter on a CPU): every document is a
sample of the kernels, with its own landmarks and its passes bounded by its span of the row, so a packed
row gives each document what it gets alone (forward and every gradient, the conv skip included), with
several splits and token blocks per document, and launches programs for the documents' lengths, not for
every document padded to the longest."""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nystrom import nystrom_attention
from nystrom.ops.nystrom import dispatch
from nystrom.ops.nystrom.fused import fused_kernels
from nystrom.ops.nystrom.fused.launch import split_programs, tuned
from nystrom.ops.nystrom.fused.plan import document_plan, plan
from nystrom.ops.plan import documents as plan_documents
from nystrom.utils import checks

from oracle import rel_err

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (pip install triton, Linux)"
)

#: 16-token blocks in every pass over the tokens: documents of a few dozen tokens take several
BLOCKS = {name: {"BN": 16} for name in ("key_pass", "query_pass", "query_backward")}


@pytest.fixture(autouse=True)
def _interpreter_only():
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the gpu-marked tests run the kernels there")


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def _inputs(b: int, h: int, n: int, d: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g).requires_grad_() for _ in range(3)]


def _check_packed_equals_alone(rows: list[list[int]], mask: torch.Tensor | None, *, m: int, taps: int | None,
                               programs: int) -> None:  # fmt: skip
    """Rows of documents of ``rows``' lengths (each row sums to n), through the fused kernels packed and
    each document alone: outputs ≤ 1e-5 and gradients (q, k, v, conv weight) ≤ 1e-4, relative."""
    b, n, h = len(rows), sum(rows[0]), 2
    cu = _offsets([x for row in rows for x in row])
    q, k, v = _inputs(b, h, n, 16)
    if mask is not None:  # padded tokens hold NaN: never read
        with torch.no_grad():
            for t in (q, k, v):
                t.masked_fill_(~mask[:, None, :, None], float("nan"))
    conv = None if taps is None else (torch.randn(h, 1, taps, 1) / taps).requires_grad_()
    args = dict(num_landmarks=m, conv_weight=conv)
    with fused_kernels(True), split_programs(programs), tuned(BLOCKS):
        packed = nystrom_attention(q, k, v, mask=mask, cu_seqlens=cu, **args)
        alone = torch.zeros_like(packed)
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            r, a, z = s // n, s % n, s % n + e - s
            piece = [t[r : r + 1, :, a:z] for t in (q, k, v)]
            dmask = None if mask is None else mask[r : r + 1, a:z]
            alone[r : r + 1, :, a:z] = nystrom_attention(*piece, mask=dmask, **args)
    real = torch.ones(b, n, dtype=torch.bool) if mask is None else mask
    weight = torch.randn(packed.shape, generator=torch.Generator().manual_seed(1)) * real[:, None, :, None]
    sel = lambda t: t.transpose(1, 2)[real]  # noqa: E731  real rows (padded rows are unspecified)
    assert torch.isfinite(sel(packed)).all()
    assert rel_err(sel(packed), sel(alone)) <= 1e-5
    wrt = [q, k, v] + ([] if conv is None else [conv])
    with fused_kernels(True), split_programs(programs), tuned(BLOCKS):
        got = torch.autograd.grad((packed.nan_to_num() * weight).sum(), wrt)
        want = torch.autograd.grad((alone.nan_to_num() * weight).sum(), wrt)
    for name, g1, g2 in zip("qkvw", got, want):
        g1, g2 = (g if name == "w" else sel(g) for g in (g1, g2))
        assert torch.isfinite(g1).all(), name
        assert float((g1 - g2).norm()) <= 1e-4 * float(g2.norm()), name


CASES = [  # rows of document lengths, mask, landmarks, conv taps, programs per call (splits)
    pytest.param([[40, 3, 53], [96], [1, 1, 64, 30]], "holes", 8, 5, 12, id="3-rows-holes-conv"),
    pytest.param([[5, 90, 2, 3]], None, 8, 3, 16, id="short-and-long-8-splits"),
    pytest.param([[7, 6, 5, 9]], "tail", 16, None, 4, id="all-shorter-than-m"),
    pytest.param([[33, 31]], None, 4, 65, 6, id="conv-wider-than-documents"),
]


@pytest.mark.parametrize("rows, kind, m, taps, programs", CASES)
def test_packed_rows_equal_documents_alone_through_the_fused_kernels(rows, kind, m, taps, programs):
    """Documents shorter and longer than m, a hole inside a document and padding at a document's tail
    (NaN there), a conv skip wider than the documents (it must not reach a neighbour), and the passes over
    the tokens cut into several splits and 16-token blocks, some past a short document's end."""
    b, n = len(rows), sum(rows[0])
    mask = None
    if kind == "holes":
        mask = torch.ones(b, n, dtype=torch.bool)
        mask[0, 10:15] = False  # inside the first document
        mask[2, 90:] = False  # the last document's tail
    elif kind == "tail":
        mask = torch.ones(b, n, dtype=torch.bool)
        mask[0, 11:13] = False  # the second document's tail: 4 of its 6 tokens stay
    _check_packed_equals_alone(rows, mask, m=m, taps=taps, programs=programs)


@settings(max_examples=3, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=16), m=st.sampled_from([1, 4, 16]),
       programs=st.integers(1, 12))  # fmt: skip
def test_hypothesis_rows_of_1_to_16_documents(lengths, m, programs):
    """1–16 documents of 1–40 tokens in one row, m above and below their lengths, 1–12 programs per call
    (a few examples: every document alone is an interpreted call of its own; more under ``-m slow``)."""
    _check_packed_equals_alone([lengths], None, m=m, taps=3, programs=programs)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=16), m=st.sampled_from([1, 4, 16, 64]),
       programs=st.integers(1, 24))  # fmt: skip
def test_hypothesis_rows_of_1_to_16_longer_documents(lengths, m, programs):
    """As above with documents of 1–300 tokens, m up to 64, 25 examples (minutes under the interpreter)."""
    _check_packed_equals_alone([lengths], None, m=m, taps=3, programs=programs)


def test_packed_rows_run_as_documents_not_padded_to_the_longest(launch_grids, monkeypatch):
    """The fused call takes the documents as its samples (no gather into a padded batch): the per-head
    kernels run one program per (document, head), the query passes cover the longest document, not the row."""
    grids = launch_grids

    def no_gather(*_a, **_k):
        raise AssertionError("the fused kernels take packed documents as they are")

    monkeypatch.setattr(dispatch, "run_packed", no_gather)
    lengths, h = [50, 3, 11, 32], 2
    q, k, v = _inputs(1, h, sum(lengths), 16)
    with fused_kernels(True), split_programs(len(lengths) * h * 4), tuned(BLOCKS):
        out = nystrom_attention(q, k, v, num_landmarks=8, cu_seqlens=_offsets(lengths))
        out.sum().backward()
    docs = len(lengths)
    assert grids["landmarks"] == (docs * h, 8)
    assert grids["landmark_pinv"] == grids["key_combine"] == grids["landmark_backward"] == (docs * h,)
    assert grids["key_pass"] == grids["query_backward"] == grids["key_backward"] == (docs * h, 4)  # 4 splits of 16
    assert grids["query_pass"] == grids["query_landmarks"] == (docs * h * 4,)  # ⌈50 / 16⌉ blocks


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8), rows=st.integers(1, 3),
       m=st.integers(1, 20), seed=st.integers(0, 2**16))  # fmt: skip
def test_the_documents_plan_is_each_documents_own_plan(lengths, rows, m, seed):
    """Every document's landmarks, counts and ranges in the packed plan are exactly those of the document
    alone (shifted to its place in its row), for random masks that leave every document a real token."""
    n = sum(lengths)
    layout = lengths * rows
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, n, generator=g) > 0.3
    cu = _offsets(layout)
    for s in cu[:-1].tolist():
        mask.view(-1)[s] = True  # every document keeps its first token
    p = document_plan(cu, mask, rows, n, m, max_seqlen=None)
    assert p.length == max(lengths) and p.spans.shape == (len(layout), 3)
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        r, a, z = s // n, s % n, s % n + e - s
        assert p.spans[i].tolist() == [r, a, z]
        own = plan(mask[r : r + 1, a:z], 1, z - a, m, "balanced", torch.device("cpu"))
        assert torch.equal(p.seg[r, a:z], own.seg[0])
        assert torch.equal(p.counts[i], own.counts[0])
        assert torch.equal(p.bounds[i], own.bounds[0] + a)


def test_a_document_with_no_real_token_raises_and_unchecked_gives_finite_rows(monkeypatch):
    """Checked, a document the mask leaves empty raises; unchecked (as on a GPU), its rows are finite and
    the other documents keep their answers."""
    lengths = [20, 6, 14]
    cu, n = _offsets(lengths), sum(lengths)
    mask = torch.ones(1, n, dtype=torch.bool)
    mask[0, 20:26] = False
    q, k, v = _inputs(1, 2, n, 16)
    with fused_kernels(True), pytest.raises(ValueError, match="document 1 .* has no real token"):
        nystrom_attention(q, k, v, num_landmarks=4, mask=mask, cu_seqlens=cu)
    for module in (checks, plan_documents):
        monkeypatch.setattr(module, "value_checks_enabled", lambda t: False)
    with fused_kernels(True):
        out = nystrom_attention(q, k, v, num_landmarks=4, mask=mask, cu_seqlens=cu)
        first = nystrom_attention(q[:, :, :20], k[:, :, :20], v[:, :, :20], num_landmarks=4)
    assert torch.isfinite(out).all()
    assert rel_err(out[:, :, :20], first) <= 1e-6


def test_packed_fused_under_compile_with_max_seqlen():
    """torch.compile traces the packed fused call (max_seqlen bounds the grids) without graph breaks."""
    lengths = [30, 5, 29]
    cu = _offsets(lengths)
    q, k, v = _inputs(1, 2, sum(lengths), 16)

    def attend(q, k, v, cu):
        return nystrom_attention(q, k, v, num_landmarks=8, cu_seqlens=cu, max_seqlen=30)

    with fused_kernels(True):
        eager = attend(q, k, v, cu)
        compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)(q, k, v, cu)
        (g_eager,) = torch.autograd.grad(eager.sum(), q)
        (g_compiled,) = torch.autograd.grad(compiled.sum(), q)
    assert rel_err(compiled, eager) <= 1e-6
    assert rel_err(g_compiled, g_eager) <= 1e-6
