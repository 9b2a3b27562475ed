"""torch.compile (fullgraph, dynamic shapes), torch.export and the meta device."""

import contextlib

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import nystrom.ops.nystrom.dispatch as dispatch
from nystrom.attention import NystromAttention
from nystrom.compat.lucidrains import NystromAttention as LucidrainsAttention
from nystrom.functional import nystrom_attention

from oracle import rel_err, right_pad_mask


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    # A cached static-shape graph from an earlier run would add its n == const guard on lookup.
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


def _fwd_bwd(mod, x, mask):
    x = x.clone().requires_grad_(True)
    out = mod(x, mask)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    return out.detach(), x.grad, [p.grad.clone() for p in mod.parameters()]


@pytest.mark.parametrize(
    "backend",
    # inductor (the default backend) also catches code that pins n while lowering; ≈ 1.5 min on 2 cores
    ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)],
)
def test_module_compiles_fullgraph_forward_backward_dynamic_lengths(backend):
    mod = NystromAttention(32, heads=2, dim_head=16, num_landmarks=8, conv_kernel_size=5)
    compiled = torch.compile(mod, fullgraph=True, dynamic=True, backend=backend)  # fullgraph: breaks raise
    for n, lengths in ((64, [64, 50]), (88, [70, 88])):
        x = torch.randn(2, n, 32)
        mask = right_pad_mask(lengths, n)
        mod.zero_grad()
        want = _fwd_bwd(mod, x, mask)
        mod.zero_grad()
        got = _fwd_bwd(compiled, x, mask)
        real = mask[..., None]
        assert rel_err(got[0] * real, want[0] * real) <= 1e-5
        assert rel_err(got[1] * real, want[1] * real) <= 1e-4
        for g, w in zip(got[2], want[2]):
            assert rel_err(g, w) <= 1e-4
    assert counters["stats"]["unique_graphs"] == 1  # the second length reused the dynamic graph


def test_no_graph_breaks_lucidrains_and_variants():
    x = torch.randn(2, 40, 32)
    mask = right_pad_mask([40, 33], 40)
    for mod in (
        LucidrainsAttention(32, dim_head=16, heads=2, num_landmarks=8, residual_conv_kernel=5),
        NystromAttention(32, heads=2, dim_head=16, num_landmarks=7, dropout=0.1),  # n % m != 0, dropout
    ):
        explained = torch._dynamo.explain(mod)(x, mask)
        assert explained.graph_break_count == 0, explained.break_reasons


def test_traceable_path_equals_fused_kernels_at_long_n(monkeypatch, two_threads):
    """Under compile/export the dispatch uses SDPA for both products; at n ≥ 16384 eager uses the fused
    CPU kernels. Both must compute the same function."""
    n = 16384
    q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
    mask = right_pad_mask([n - 1000], n)
    grads = []
    for fused in (True, False):
        monkeypatch.setattr(dispatch, "_eager", lambda fused=fused: fused)
        out = nystrom_attention(q, k, v, num_landmarks=32, mask=mask)
        (out[:, :, : n - 1000] ** 2).sum().backward()
        grads.append((out.detach(), *(t.grad.clone() for t in (q, k, v))))
        for t in (q, k, v):
            t.grad = None
    real = slice(0, n - 1000)
    for a, b in zip(grads[0], grads[1]):
        assert rel_err(a[:, :, real], b[:, :, real]) <= 1e-5


def test_export_module_and_encoder():  # the encoder: the whole model's output class is the model's business
    mod = NystromAttention(32, heads=2, dim_head=16, num_landmarks=8).eval()
    x = torch.randn(2, 48, 32)
    mask = right_pad_mask([48, 30], 48)
    ep = torch.export.export(mod, (x, mask))
    assert rel_err(ep.module()(x, mask)[mask], mod(x, mask)[mask]) <= 1e-6

    from nystrom.model import NystromformerConfig, NystromformerModel

    cfg = NystromformerConfig.preset("lra", vocab_size=20, max_position_embeddings=64, hidden_size=32)
    encoder = NystromformerModel(cfg).encoder.eval()
    h = torch.randn(2, 64, 32)
    mask = right_pad_mask([64, 40], 64)
    ep = torch.export.export(encoder, (h, mask))
    # the encoder returns (hidden states, all layers' states or None, attention weights or None)
    assert rel_err(ep.module()(h, mask)[0][mask], encoder(h, mask)[0][mask]) <= 1e-5


def test_model_compiles_fullgraph_forward_backward():
    from nystrom.model import NystromformerConfig, NystromformerForSequenceClassification

    cfg = NystromformerConfig.preset("lra", vocab_size=20, max_position_embeddings=64, num_labels=3)
    model = NystromformerForSequenceClassification(cfg).eval()  # eval: no dropout, so outputs compare
    ids = torch.randint(1, 20, (2, 64))
    am = torch.ones(2, 64, dtype=torch.long)
    am[0, 50:] = 0
    labels = torch.tensor([0, 2])
    want = model(ids, attention_mask=am, labels=labels)
    want.loss.backward()
    want_g = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = torch.compile(model, fullgraph=True, backend="aot_eager")(ids, attention_mask=am, labels=labels)
    got.loss.backward()
    assert abs(got.loss.item() - want.loss.item()) <= 1e-5
    for g, w in zip((p.grad for p in model.parameters()), want_g):
        assert rel_err(g, w) <= 1e-4


def test_meta_device_forward():
    with torch.device("meta"):
        mod = NystromAttention(64, heads=4, dim_head=16, num_landmarks=8)
        lucid = LucidrainsAttention(64, dim_head=16, heads=4, num_landmarks=8)
        x = torch.empty(2, 100, 64)
        mask = torch.ones(2, 100, dtype=torch.bool)
    for m in (mod, lucid):
        out = m(x, mask)
        assert out.device.type == "meta" and out.shape == (2, 100, 64)


def test_nystrom_attention_compiles_fullgraph_on_the_accelerator_path():
    """``torch.compile(nystrom_attention, fullgraph=True)`` on the accelerator path: 0 graph breaks (a break
    raises, naming its cause), and the eager accelerator path's values and gradients. AOT autograd without
    inductor (21 s → 1 s on 2 cores): inductor's lowering of this path, forward and backward with padding,
    is tests/ops/test_accelerator_matrix.py's compiled training step."""
    from nystrom.utils.device import force_accelerator_path

    q, k, v = (torch.randn(2, 2, 40, 16, requires_grad=True) for _ in range(3))
    mask = right_pad_mask([40, 27], 40)
    go = torch.randn(2, 2, 40, 16) * mask[:, None, :, None]

    def attend(q, k, v, mask):
        return nystrom_attention(q, k, v, num_landmarks=8, mask=mask)

    with force_accelerator_path():
        results = []
        for fn in (attend, torch.compile(attend, fullgraph=True, backend="aot_eager")):
            out = fn(q, k, v, mask)
            results.append((out.detach(), *torch.autograd.grad(out, (q, k, v), go)))
    real = mask[:, None, :, None]
    for got, want in zip(results[1], results[0]):
        assert rel_err(got * real, want * real) <= 1e-5


@pytest.mark.parametrize("forced", [True, False], ids=["accelerator-path", "cpu-path"])
def test_a_compiled_step_that_enters_autocast_itself_equals_eager(forced):
    """Regression: ``torch.compile`` of a whole step that opens ``torch.autocast`` itself, forward and
    ``backward()`` inside, failed in the compiled backward with "expected scalar type BFloat16 but found
    Float": inductor dropped the cast back to bf16 after A⁺·(B·V)'s float32 GEMM (torch 2.13). The
    traceable path now computes B·V in float32 (ops/nystrom/traceable.py)."""
    from nystrom.model import NystromformerConfig, NystromformerForMaskedLM
    from nystrom.utils.device import force_accelerator_path

    cfg = NystromformerConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, dropout=0.0,
        attention={"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 3},
    )  # fmt: skip
    model = NystromformerForMaskedLM(cfg)
    ids = torch.randint(1, 50, (2, 30))

    def step():
        with torch.autocast("cpu", torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        return loss.detach()

    results = []
    with force_accelerator_path() if forced else contextlib.nullcontext():
        for fn in (step, torch.compile(step)):
            model.zero_grad()
            loss = fn()
            results.append((loss, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (want, want_g), (got, got_g) = results
    assert abs(got.item() - want.item()) <= 5e-3 * abs(want.item())  # measured 2e-6: bf16 roundings
    assert len(got_g) == len(want_g) > 8
    for g, w in zip(got_g, want_g):
        assert rel_err(g, w) <= 0.05, rel_err(g, w)  # measured ≤ 0.011
