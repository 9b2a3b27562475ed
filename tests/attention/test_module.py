"""NystromAttention / SoftmaxAttention modules and the registry."""

import inspect

import pytest
import torch

from nystrom import REGISTRY, NystromAttention, SoftmaxAttention
from nystrom.attention import AttentionBase

from oracle import rel_err, softmax_oracle


def test_registry_entries_share_the_interface():
    assert REGISTRY["nystrom"] is NystromAttention and REGISTRY["softmax"] is SoftmaxAttention
    for name, cls in REGISTRY.items():
        assert issubclass(cls, AttentionBase) and cls.name == name
        params = inspect.signature(cls.__init__).parameters
        assert list(params)[:2] == ["self", "dim"]
        for p in ("heads", "dim_head"):
            assert params[p].kind is inspect.Parameter.KEYWORD_ONLY
        assert list(inspect.signature(cls.forward).parameters) == ["self", "x", "mask", "cu_seqlens", "max_seqlen"]


def test_softmax_module_matches_oracle_with_mask():
    mod = SoftmaxAttention(24, heads=3, dim_head=8).double()
    x = torch.randn(2, 11, 24, dtype=torch.float64)
    mask = torch.arange(11)[None] < torch.tensor([[11], [6]])
    out = mod(x, mask=mask)
    qkv = mod.qkv(x).unflatten(-1, (3, 3, 8)).permute(2, 0, 3, 1, 4)
    ref = softmax_oracle(qkv[0], qkv[1], qkv[2], mask).transpose(1, 2).flatten(2)
    ref = mod.out(ref)
    assert rel_err(out[0], ref[0]) <= 1e-12 and rel_err(out[1, :6], ref[1, :6]) <= 1e-12


def test_nystrom_module_m_ge_n_exact_equals_softmax_module():
    ny = NystromAttention(
        16, heads=2, dim_head=8, num_landmarks=64, pinv="exact", conv_kernel_size=None
    ).double()
    sm = SoftmaxAttention(16, heads=2, dim_head=8).double()
    sm.load_state_dict(ny.state_dict())
    x = torch.randn(3, 20, 16, dtype=torch.float64)
    assert rel_err(ny(x), sm(x)) <= 1e-10


def test_any_length_works_and_shapes():
    mod = NystromAttention(32, heads=2, dim_head=16, num_landmarks=8)
    for n in (1, 3, 8, 13, 200):
        assert mod(torch.randn(2, n, 32)).shape == (2, n, 32)


def test_conv_skip_is_added_and_layout_is_hf():
    mod = NystromAttention(16, heads=2, dim_head=8, conv_kernel_size=7)
    assert mod.conv.weight.shape == (2, 1, 7, 1)
    x = torch.randn(1, 30, 16)
    with_conv = mod(x)
    torch.nn.init.zeros_(mod.conv.weight)
    assert rel_err(with_conv, mod(x)) > 1e-3


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_landmarks=0), "num_landmarks"),
        (dict(conv_kernel_size=4), "odd"),
        (dict(pinv_init="nope"), "pinv_init"),
        (dict(pinv="nope"), "pinv"),
        (dict(heads=0), "heads"),
        (dict(dropout=1.5), "dropout"),
        (dict(causal=True), "bidirectional"),
    ],
)
def test_bad_config_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NystromAttention(16, **{"heads": 2, "dim_head": 8, **kwargs})


def test_bad_forward_inputs_raise():
    mod = NystromAttention(16, heads=2, dim_head=8)
    with pytest.raises(ValueError, match=r"\(batch, tokens, 16\)"):
        mod(torch.randn(2, 5, 15))
    with pytest.raises(ValueError, match=r"\(batch, tokens, 16\)"):
        mod(torch.randn(5, 16))
    with pytest.raises(TypeError, match="floating-point"):
        mod(torch.ones(2, 5, 16, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.bool"):
        mod(torch.randn(2, 5, 16), mask=torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="no real token"):
        mod(torch.randn(2, 5, 16), mask=torch.tensor([[True] * 5, [False] * 5]))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("needs", ["all", "x_only", "weights_only"])
def test_project_heads_matches_linear_then_split(bias, needs):
    """The fused projection's backward (∂q, ∂k, ∂v used where they lie) equals autograd's."""
    import torch.nn.functional as F

    from nystrom.layers.projection import project_heads, split_heads

    torch.manual_seed(0)
    x = torch.randn(2, 11, 24, dtype=torch.double)
    w = torch.randn(3 * 4 * 6, 24, dtype=torch.double)
    b = torch.randn(3 * 4 * 6, dtype=torch.double) if bias else None
    grads = [torch.randn(2, 4, 11, 6, dtype=torch.double) for _ in range(3)]
    results = []
    for fn in (project_heads, lambda x, w, b, h, d: split_heads(F.linear(x, w, b), h, d)):
        xs, ws = (
            x.clone().requires_grad_(needs != "weights_only"),
            w.clone().requires_grad_(needs != "x_only"),
        )
        bs = None if b is None else b.clone().requires_grad_(needs != "x_only")
        q, k, v = fn(xs, ws, bs, 4, 6)
        # k gets no gradient at all and v a transposed-layout one: both paths must still agree
        (q * grads[0]).sum().add((v.mT.contiguous().mT * grads[2]).sum()).backward()
        results.append([t.grad for t in (xs, ws, bs) if t is not None])
        assert q.shape == (2, 4, 11, 6)
    for a, c in zip(*results):
        if a is None or c is None:
            assert a is None and c is None
        else:
            torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", [NystromAttention, SoftmaxAttention])
def test_exported_attention_leaves_out_the_key_bias_that_cancels(cls):
    """k enters nystrom's and softmax's scores only through softmaxes over keys (or their means), where its
    bias shifts a whole row and cancels: the exported module has one bias add fewer (q's and v's remain)
    and the same outputs, with and without padding."""
    from nystrom.layers.projection import project_heads

    assert cls.key_bias_cancels
    torch.manual_seed(0)
    extra = {"num_landmarks": 4} if cls is NystromAttention else {}
    mod = cls(24, heads=3, dim_head=8, **extra).double().eval()
    with torch.no_grad():
        mod.qkv.bias.normal_(0, 3.0)  # a large k bias: dropping it must still give the same scores
    x = torch.randn(2, 13, 24, dtype=torch.float64)
    mask = torch.arange(13)[None] < torch.tensor([[13], [7]])
    for given in ({}, {"mask": mask}):
        exported = torch.export.export(mod, (x,), given).module()
        torch.testing.assert_close(exported(x, **given), mod(x, **given), rtol=1e-10, atol=1e-10)

    class Projection(torch.nn.Module):
        def __init__(self, cancels: bool) -> None:
            super().__init__()
            self.cancels = cancels

        def forward(self, x, w, b):
            return project_heads(x, w, b, 3, 8, key_bias_cancels=self.cancels)

    adds = []
    for cancels in (False, True):
        graph = torch.export.export(Projection(cancels), (x, mod.qkv.weight, mod.qkv.bias)).graph
        adds.append(sum(n.target == torch.ops.aten.add.Tensor for n in graph.nodes))
    assert adds == [3, 2]
