"""Differential tests against HuggingFace's and lucidrains' Nyström attention, with copied weights.

Only under the conditions where their maths is right: batch 1 (their Z₀ is scaled over the whole batch),
m | n (lucidrains left-pads otherwise; HF requires it), no padding, and our ``pinv_init="original"``.
"""

import pytest
import torch
from nystrom_attention import NystromAttention as LucidNystrom
from transformers import NystromformerConfig
from transformers.models.nystromformer.modeling_nystromformer import NystromformerSelfAttention

from nystrom import NystromAttention

from oracle import rel_err


def _ours_from_hf(
    hf: NystromformerSelfAttention, heads: int, d: int, m: int, conv: int | None
) -> NystromAttention:
    inner = heads * d
    ours = NystromAttention(
        inner, heads=heads, dim_head=d, num_landmarks=m, pinv_init="original", conv_kernel_size=conv
    )
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([hf.query.weight, hf.key.weight, hf.value.weight]))
        ours.qkv.bias.copy_(torch.cat([hf.query.bias, hf.key.bias, hf.value.bias]))
        ours.out.weight.copy_(torch.eye(inner))  # HF's self-attention stops before the output dense
        ours.out.bias.zero_()
        if conv is not None:
            ours.conv.weight.copy_(hf.conv.weight)
    return ours


@pytest.mark.parametrize("conv", [None, 5])
@pytest.mark.parametrize("n,m", [(64, 8), (128, 16)])
def test_matches_huggingface_self_attention(n, m, conv):
    heads, d = 4, 16
    cfg = NystromformerConfig(
        hidden_size=heads * d,
        num_attention_heads=heads,
        num_landmarks=m,
        segment_means_seq_len=n,
        conv_kernel_size=conv or 3,
        attention_probs_dropout_prob=0.0,
        inv_coeff_init_option=False,
    )
    hf = NystromformerSelfAttention(cfg).eval()
    if conv is None:
        hf.conv_kernel_size = None  # HF's config refuses None; its module honours it
    ours = _ours_from_hf(hf, heads, d, m, conv).eval()
    x = (torch.randn(1, n, heads * d) * 2).requires_grad_()
    ref = hf(x)[0]
    out = ours(x)
    assert rel_err(out, ref) <= 1e-5
    g = torch.randn_like(ref)
    gx_ref, gw_ref = torch.autograd.grad(ref, (x, hf.query.weight), g)
    gx, gw = torch.autograd.grad(out, (x, ours.qkv.weight), g)
    assert rel_err(gx, gx_ref) <= 1e-4
    assert rel_err(gw[: heads * d], gw_ref) <= 1e-4


def test_huggingface_exact_regime_is_softmax_plus_conv():
    # num_landmarks == segment_means_seq_len makes HF run exact softmax attention: our m = n, exact pinv.
    heads, d, n = 2, 8, 32
    cfg = NystromformerConfig(
        hidden_size=heads * d,
        num_attention_heads=heads,
        num_landmarks=n,
        segment_means_seq_len=n,
        conv_kernel_size=3,
        attention_probs_dropout_prob=0.0,
    )
    hf = NystromformerSelfAttention(cfg).eval()
    ours = _ours_from_hf(hf, heads, d, n, 3)
    ours.pinv = "exact"
    x = torch.randn(1, n, heads * d, dtype=torch.float64)
    assert rel_err(ours.double()(x), hf.double()(x)[0]) <= 1e-10


@pytest.mark.parametrize("conv", [None, 33])
@pytest.mark.parametrize("n,m", [(256, 64), (96, 32)])
def test_matches_lucidrains(n, m, conv):
    heads, d, dim = 4, 16, 48
    lucid = LucidNystrom(
        dim=dim,
        dim_head=d,
        heads=heads,
        num_landmarks=m,
        pinv_iterations=6,
        residual=conv is not None,
        residual_conv_kernel=conv or 33,
    ).eval()
    ours = NystromAttention(
        dim, heads=heads, dim_head=d, num_landmarks=m, pinv_init="original", conv_kernel_size=conv
    )
    with torch.no_grad():
        ours.qkv.weight.copy_(lucid.to_qkv.weight)
        ours.qkv.bias.zero_()  # lucidrains' projection has no bias
        ours.out.load_state_dict(lucid.to_out[0].state_dict())
        if conv is not None:
            ours.conv.weight.copy_(lucid.res_conv.weight)
    x = torch.randn(1, n, dim, requires_grad=True)
    ref, out = lucid(x), ours(x)
    assert rel_err(out, ref) <= 1e-5
    g = torch.randn_like(ref)
    gx_ref, gw_ref = torch.autograd.grad(ref, (x, lucid.to_qkv.weight), g)
    gx, gw = torch.autograd.grad(out, (x, ours.qkv.weight), g)
    assert rel_err(gx, gx_ref) <= 1e-4
    assert rel_err(gw, gw_ref) <= 1e-4


def test_lucidrains_batch_dependence_is_their_fault_not_ours():
    heads, d, dim, n, m = 2, 16, 32, 64, 16
    lucid = LucidNystrom(dim=dim, dim_head=d, heads=heads, num_landmarks=m, residual=False).eval()
    ours = NystromAttention(dim, heads=heads, dim_head=d, num_landmarks=m, conv_kernel_size=None)
    with torch.no_grad():
        ours.qkv.weight.copy_(lucid.to_qkv.weight)
        ours.qkv.bias.zero_()
        ours.out.load_state_dict(lucid.to_out[0].state_dict())
    x = torch.randn(3, n, dim)
    x[1:] *= 8
    assert rel_err(lucid(x)[:1], lucid(x[:1])) > 1e-4
    assert rel_err(ours(x)[:1], ours(x[:1])) <= 1e-6
