"""The accelerator path (the GPU's composite ops), run on CPU tensors with ``force_accelerator_path``: the same numbers
as the CPU kernels and the float64 oracles, masks shared once per forward, no CPU blocking."""

import pytest
import torch

import nystrom.ops.nystrom.landmarks as landmarks
from nystrom import NystromAttention
from nystrom.functional import nystrom_attention
from nystrom.model import NystromformerConfig, NystromformerModel
from nystrom.ops.nystrom.landmarks import averaging_weights, segment_means
from nystrom.ops.plan import shared_plan
from nystrom.utils.device import accelerator_path, force_accelerator_path

from oracle import nystrom_oracle, rel_err, right_pad_mask, softmax_oracle


def test_the_path_predicate_treats_meta_like_cuda_and_can_be_forced_on_cpu():
    assert accelerator_path(torch.empty(1, device="meta"))
    assert not accelerator_path(torch.empty(1))
    with force_accelerator_path():
        assert accelerator_path(torch.empty(1))
    assert not accelerator_path(torch.empty(1))


@pytest.mark.parametrize("segments", ["balanced", "front_padded"])
@pytest.mark.parametrize(
    ("n", "m", "mask_kind"),
    # (20, 8): front-padded runs of 3 after 4 virtual positions leave landmark 0 empty although n ≥ m
    [(48, 8, None), (50, 8, None), (20, 8, None), (6, 8, None), (48, 8, "holes"), (40, 8, "short")],
)
def test_averaging_weights_give_the_segment_means(n, m, mask_kind, segments):
    x = torch.randn(2, 3, n, 4, dtype=torch.float64)
    mask = None
    if mask_kind == "holes":
        mask = torch.rand(2, n) > 0.3
        mask[:, 0] = True
    elif mask_kind == "short":  # the second sample has fewer real tokens than landmarks
        mask = right_pad_mask([n, 5], n)
    ref, ref_valid = segment_means(x, m, mask, segments=segments)
    w, valid = averaging_weights(mask, 2, n, m, x.device, segments=segments, dtype=torch.float64)
    got = w[:, None] @ x  # (b, h, m, d)
    assert rel_err(got, ref) <= 1e-14
    if valid is None:  # "every landmark used" may only be claimed without a mask and with n >= m
        assert mask is None and n >= m and bool(ref_valid.all())
    else:
        assert torch.equal(valid, ref_valid)


@pytest.mark.parametrize("pinv", ["iterative", "exact"])
def test_accelerator_path_equals_the_cpu_kernels_values_and_gradients(pinv):
    b, h, n, d, m = 2, 3, 70, 8, 16
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = right_pad_mask([n, 11], n)  # the second sample has fewer real tokens than landmarks
    go = torch.randn(b, h, n, d, dtype=torch.float64)
    outs = []
    for forced in (False, True):
        with force_accelerator_path() if forced else torch.enable_grad():
            out = nystrom_attention(q, k, v, num_landmarks=m, mask=mask, pinv=pinv)
            grads = torch.autograd.grad(out, (q, k, v), go)
        real = mask[:, None, :, None].expand_as(out)
        outs.append((out[real], [g for g in grads]))
    (cpu, cpu_g), (acc, acc_g) = outs
    assert rel_err(acc, cpu) <= 1e-12
    for a, c in zip(acc_g, cpu_g):
        assert rel_err(a, c) <= 1e-10


def test_accelerator_path_is_exact_at_m_equal_n_and_matches_the_oracle():
    q, k, v = (torch.randn(1, 2, 24, 8, dtype=torch.float64) for _ in range(3))
    mask = right_pad_mask([19], 24)
    with force_accelerator_path():
        exact = nystrom_attention(q, k, v, num_landmarks=24, pinv="exact")
        approx = nystrom_attention(q, k, v, num_landmarks=6, mask=mask, pinv="exact")
    assert rel_err(exact, softmax_oracle(q, k, v)) <= 1e-10
    assert rel_err(approx[:, :, :19], nystrom_oracle(q, k, v, 6, mask)[:, :, :19]) <= 1e-10


def test_accelerator_path_padding_invariance_with_garbage_and_conv():
    L, n = 13, 36  # fewer real tokens than 2 landmarks per segment, the second sample unpadded
    mod = NystromAttention(24, heads=3, dim_head=8, num_landmarks=6, conv_kernel_size=7).double().eval()
    x, mask = torch.randn(2, n, 24, dtype=torch.float64), right_pad_mask([L, n], n)
    with force_accelerator_path():
        full = mod(x, mask=mask)
        alone = mod(x[:1, :L])
        x2 = x.clone()
        x2[0, L:] = float("nan")  # padded inputs may hold anything
        again = mod(x2, mask=mask)
    assert rel_err(full[0, :L], alone[0]) <= 1e-12
    assert rel_err(again[0, :L], full[0, :L]) <= 1e-12
    assert rel_err(full, mod(x, mask=mask)) <= 1e-12  # and the CPU path agrees


def _model(layers: int = 3) -> NystromformerModel:
    cfg = NystromformerConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, dropout=0.0,
        attention={"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 3},
    )  # fmt: skip
    return NystromformerModel(cfg).double().eval()


@pytest.mark.parametrize("forced", [False, True])
def test_a_model_computes_the_landmark_assignment_once_per_forward(monkeypatch, forced):
    calls = []
    real = landmarks.landmark_assignment
    monkeypatch.setattr(landmarks, "landmark_assignment", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model = _model(layers=3)
    ids = torch.randint(1, 50, (2, 30))
    mask = right_pad_mask([30, 17], 30).long()
    with force_accelerator_path() if forced else torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert len(calls) == 1  # not once per layer (3), nor twice per layer (q and k)
    alone = model(input_ids=ids[1:, :17]).last_hidden_state
    assert rel_err(out[1, :17], alone[0]) <= 1e-12


def test_sharing_is_per_mask_object_and_version():
    x = torch.randn(1, 2, 20, 4, dtype=torch.float64)
    mask = right_pad_mask([15], 20)
    other = mask.clone()
    other[0, 3] = False
    with shared_plan(mask):
        a = segment_means(x, 4, mask)[0]
        b = segment_means(x, 4, other)[0]  # another mask: computed for itself
        mask[0, 3] = False  # modified in place: the shared result is stale, so it is recomputed
        c = segment_means(x, 4, mask)[0]
    assert rel_err(b, segment_means(x, 4, other)[0]) == 0
    assert torch.equal(c, b)
    assert not torch.equal(a, b)


def test_no_cpu_cache_blocking_on_the_accelerator_path(monkeypatch):
    from nystrom.layers import ffn
    from nystrom.ops.conv import banded as conv

    monkeypatch.setattr(ffn, "BLOCK_BYTES", 8)  # one row per block on CPU
    monkeypatch.setattr(conv, "GROUP_BYTES", 8)  # one head per group on CPU
    h = torch.randn(40, 6)
    v = torch.randn(2, 4, 30, 8)
    assert len(ffn._blocks(h)) == 40 and len(conv._head_groups(v)) == 4
    with force_accelerator_path():
        assert ffn._blocks(h) == [slice(0, 40)]
        assert conv._head_groups(v) == [slice(0, 4)]
        w = torch.randn(4, 5)
        assert rel_err(conv.depthwise_seq_conv(v, w), conv.depthwise_seq_conv(v, w)) == 0


def test_model_training_step_agrees_between_the_paths():
    model = _model(layers=2)
    ids = torch.randint(1, 50, (2, 30))
    mask = right_pad_mask([30, 17], 30).long()
    results = []
    for forced in (False, True):
        model.zero_grad()
        with force_accelerator_path() if forced else torch.enable_grad():
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state
            out[mask.bool()].square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append((out.detach()[mask.bool()], grads))
        with torch.no_grad(), force_accelerator_path() if forced else torch.no_grad():
            assert (
                rel_err(
                    model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()], results[-1][0]
                )
                <= 1e-12
            )
    (cpu, cpu_g), (acc, acc_g) = results
    assert rel_err(acc, cpu) <= 1e-12
    assert len(acc_g) == len(cpu_g) > 10
    for a, c in zip(acc_g, cpu_g):
        assert rel_err(a, c) <= 1e-9


def test_sharing_under_inference_mode_where_masks_keep_no_version_counter():
    model = _model(layers=2)
    ids = torch.randint(1, 50, (2, 30))
    mask = right_pad_mask([30, 17], 30)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).last_hidden_state
    for forced in (False, True):
        with torch.inference_mode(), force_accelerator_path() if forced else torch.inference_mode():
            inference_mask = mask.clone()  # an inference tensor: no version counter
            got = model(input_ids=ids, attention_mask=inference_mask).last_hidden_state
        assert rel_err(got[mask], want[mask]) <= 1e-12


@pytest.mark.parametrize("n", [20, 21, 24])
def test_accelerator_path_front_padded_segments_without_mask_equal_the_cpu_kernels(n):
    """lucidrains' front-padded runs leave the first landmarks empty when m does not divide n (20 and 21
    tokens, 8 landmarks), even without a mask and with n ≥ m: those must be masked out, as the CPU path does."""
    q, k, v = (torch.randn(2, 3, n, 8, dtype=torch.float64) for _ in range(3))
    cpu = nystrom_attention(q, k, v, num_landmarks=8, segments="front_padded")
    with force_accelerator_path():
        acc = nystrom_attention(q, k, v, num_landmarks=8, segments="front_padded")
    assert rel_err(acc, cpu) <= 1e-12
