"""attn_implementation="nystrom" in transformers' own models (BERT, RoBERTa, ViT), built from small random
configs: exact against SDPA at m = n with the exact pseudo-inverse, padding exact, gradients, clear errors."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    AttentionInterface,
    AutoModel,
    BertConfig,
    BertModel,
    RobertaConfig,
    RobertaModel,
    ViTConfig,
    ViTModel,
)
from transformers.masking_utils import (
    AttentionMaskInterface,
    and_masks,
    bidirectional_mask_function,
    causal_mask_function,
    padding_mask_function,
    sliding_window_bidirectional_overlay,
)

from nystrom.compat.hf_attention import key_padding_mask, nystrom_attention_forward, nystrom_mask, register

N = 16  # tokens of the text tests


def bert_config(**kw) -> BertConfig:
    base = dict(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=300,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertConfig(**{**base, **kw})


def pair(cls, config, options: dict | None, dtype=torch.float64):
    """The same weights under "nystrom" (with ``options``) and "sdpa", in eval mode."""
    config = copy.deepcopy(config)
    if options is not None:
        config.nystrom_attention = options
    nys = cls._from_config(config, attn_implementation="nystrom").to(dtype).eval()
    ref = cls._from_config(copy.deepcopy(config), attn_implementation="sdpa").to(dtype).eval()
    ref.load_state_dict(nys.state_dict())
    assert (nys.config._attn_implementation, ref.config._attn_implementation) == ("nystrom", "sdpa")
    return nys, ref


def padded_batch(lengths: list[int], n: int = N, vocab: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(2, vocab, (len(lengths), n))
    mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (b, n) True = real token
    return ids, mask.long()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_registered_under_both_interfaces_idempotently():
    register()
    register()
    assert AttentionInterface._global_mapping["nystrom"] is nystrom_attention_forward
    assert AttentionMaskInterface._global_mapping["nystrom"] is nystrom_mask


def test_bert_exact_against_sdpa_at_m_equals_n_with_padding():
    nys, ref = pair(BertModel, bert_config(), {"num_landmarks": N, "pinv": "exact"})
    ids, mask = padded_batch([N, 11, 4])
    a = nys(ids, attention_mask=mask).last_hidden_state
    b = ref(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert rel(a[real], b[real]) <= 1e-12


def test_bert_gradients_match_sdpa_at_the_exact_setting():
    # At m = n the output is F·A⁺·B·V with F = A = B, exact for any A, but the pinv's backward cancels
    # terms of size κ(A)²·eps: BERT's 0.02 init makes the attention near-uniform and A near rank one
    # (relative gradient error 33), so the weights are drawn wider (0.2: 1e-11 to 1e-7 over seeds).
    n = 8
    nys, ref = pair(BertModel, bert_config(initializer_range=0.2), {"num_landmarks": n, "pinv": "exact"})
    ids, mask = padded_batch([n, 5], n=n)
    weight = torch.randn(2, n, 32, dtype=torch.float64) * mask[..., None]  # real tokens only
    grads = []
    for model in (nys, ref):
        (model(ids, attention_mask=mask).last_hidden_state * weight).sum().backward()
        grads.append({k: p.grad for k, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 30
    flat = [torch.cat([g.flatten() for g in gs.values()]) for gs in grads]
    assert rel(flat[0], flat[1]) <= 1e-6
    for name in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"):
        assert rel(grads[0][name], grads[1][name]) <= 1e-6, name


def test_gradients_of_a_padded_sample_equal_the_unpadded_ones():
    # Padding exact for the backward too, under the approximation (4 landmarks, iterative pinv).
    nys, _ = pair(BertModel, bert_config(), {"num_landmarks": 4})
    ids, mask = padded_batch([N, 7])
    weight = torch.randn(N, 32, dtype=torch.float64)
    grads = []
    for out in (
        nys(ids, attention_mask=mask).last_hidden_state[1, :7],
        nys(ids[1:, :7]).last_hidden_state[0],
    ):
        nys.zero_grad()
        (out * weight[:7]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in nys.parameters() if p.grad is not None]))
    assert grads[0].norm() > 0 and rel(grads[0], grads[1]) <= 1e-12


def test_padding_is_exact_under_the_approximation():
    # 4 landmarks, iterative pinv: far from exact softmax, but a padded sample equals the unpadded one.
    nys, _ = pair(BertModel, bert_config(), {"num_landmarks": 4})
    lengths = [N, 11, 6]
    ids, mask = padded_batch(lengths)
    out = nys(ids, attention_mask=mask).last_hidden_state
    other = ids.masked_fill(~mask.bool(), 0) + (~mask.bool()) * torch.randint(2, 50, ids.shape)
    assert not torch.equal(other, ids)
    out_other = nys(other, attention_mask=mask).last_hidden_state  # padded ids changed: nothing real moves
    for i, L in enumerate(lengths):
        alone = nys(ids[i : i + 1, :L]).last_hidden_state[0]
        assert rel(out[i, :L], alone) <= 1e-12
        assert rel(out_other[i, :L], alone) <= 1e-12


def test_without_the_mask_function_padding_would_leak(monkeypatch):
    # Why the mask function is registered: transformers builds no mask for a name it has none for.
    nys, _ = pair(BertModel, bert_config(), {"num_landmarks": 4})
    ids, mask = padded_batch([N, 7])
    alone = nys(ids[1:, :7]).last_hidden_state[0]
    assert rel(nys(ids, attention_mask=mask).last_hidden_state[1, :7], alone) <= 1e-12
    monkeypatch.delitem(AttentionMaskInterface._global_mapping, "nystrom")
    assert rel(nys(ids, attention_mask=mask).last_hidden_state[1, :7], alone) > 1e-3


def test_a_4d_key_padding_mask_is_accepted_and_other_4d_masks_raise():
    nys, _ = pair(BertModel, bert_config(), {"num_landmarks": 4})
    ids, mask = padded_batch([N, 10])
    out = nys(ids, attention_mask=mask).last_hidden_state
    as_4d = mask.bool()[:, None, None, :].expand(2, 1, N, N)
    assert rel(nys(ids, attention_mask=as_4d).last_hidden_state[1, :10], out[1, :10]) <= 1e-12
    causal = torch.ones(N, N, dtype=torch.bool).tril()[None, None].expand(2, 1, N, N)
    with pytest.raises(ValueError, match="key-padding masks only"):
        nys(ids, attention_mask=causal)


def test_a_composed_mask_function_is_materialised_then_checked():
    # A model's or/and_mask_function makes the mask function build the 4-D mask SDPA would get.
    pad = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    only_padding = and_masks(bidirectional_mask_function, padding_mask_function(pad))
    full = nystrom_mask(2, 6, 6, mask_function=only_padding, attention_mask=pad)
    assert full.shape == (2, 1, 6, 6) and torch.equal(key_padding_mask(full, 2, 6), pad)
    assert torch.equal(nystrom_mask(2, 6, 6, attention_mask=pad), pad)  # the plain case stays 2-D
    window = and_masks(bidirectional_mask_function, sliding_window_bidirectional_overlay(2))
    with pytest.raises(ValueError, match="key-padding masks only"):
        key_padding_mask(nystrom_mask(2, 6, 6, mask_function=window, attention_mask=pad), 2, 6)


def test_additive_float_masks():
    keep = torch.tensor([[True, True, False], [True, False, False]])
    additive = torch.zeros(2, 1, 3, 3).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float32).min)
    assert torch.equal(key_padding_mask(additive, 2, 3), keep)
    with pytest.raises(ValueError, match="bias"):
        key_padding_mask(additive + 0.5, 2, 3)


def test_roberta_exact_against_sdpa_with_padding():
    config = RobertaConfig(**bert_config().to_dict())
    config.pad_token_id = 1
    nys, ref = pair(RobertaModel, config, {"num_landmarks": N, "pinv": "exact"})
    ids, mask = padded_batch([N, 12])
    ids = ids.masked_fill(~mask.bool(), 1)
    real = mask.bool()
    a = nys(ids, attention_mask=mask).last_hidden_state
    assert rel(a[real], ref(ids, attention_mask=mask).last_hidden_state[real]) <= 1e-12


def test_vit_exact_against_sdpa_at_m_equals_patches_plus_one():
    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64,
    )  # fmt: skip
    nys, ref = pair(ViTModel, config, {"num_landmarks": 16 + 1, "pinv": "exact"})
    pixels = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    a, b = nys(pixels).last_hidden_state, ref(pixels).last_hidden_state
    assert a.shape == (2, 17, 32) and rel(a, b) <= 1e-11
    # Fewer landmarks than tokens: really the approximation, and still close for a random ViT.
    nys.config.nystrom_attention = {"num_landmarks": 4}
    assert 1e-6 < rel(nys(pixels).last_hidden_state, b) < 0.05


def test_default_options_on_a_longer_input_stay_close_to_sdpa():
    # {} = nystrom_attention's own defaults: 64 landmarks, 6 pinv iterations, on 256 tokens. BERT's 0.02
    # init gives near-uniform attention, which any method approximates (2e-5); 0.1 gives real structure.
    nys, ref = pair(BertModel, bert_config(initializer_range=0.1), {}, dtype=torch.float32)
    assert nys.config.nystrom_attention == {}
    ids, mask = padded_batch([256, 200], n=256)
    real = mask.bool()
    out, exact = (m(ids, attention_mask=mask).last_hidden_state[real] for m in (nys, ref))
    assert 1e-3 < rel(out, exact) < 0.02  # measured 7e-3 to 9e-3 over seeds


def test_no_options_attribute_means_the_defaults():
    nys, _ = pair(BertModel, bert_config(), None)
    assert not hasattr(nys.config, "nystrom_attention")
    ids = torch.randint(2, 50, (1, 80))
    out = nys(ids).last_hidden_state
    nys.config.nystrom_attention = {"num_landmarks": 64, "pinv_iterations": 6}
    assert torch.equal(nys(ids).last_hidden_state, out)


def test_attention_dropout_is_not_applied_in_training():
    nys, _ = pair(BertModel, bert_config(attention_probs_dropout_prob=0.5), {"num_landmarks": 4})
    ids, mask = padded_batch([N, 9])
    eval_out = nys(ids, attention_mask=mask).last_hidden_state
    train_out = nys.train()(ids, attention_mask=mask).last_hidden_state  # hidden dropout is 0 here
    assert torch.equal(train_out, eval_out)


def test_save_and_load_with_from_pretrained(tmp_path):
    config = bert_config()
    config.nystrom_attention = {"num_landmarks": N, "pinv": "exact"}
    BertModel(config).save_pretrained(tmp_path)
    nys = AutoModel.from_pretrained(tmp_path, attn_implementation="nystrom", dtype=torch.float64).eval()
    ref = AutoModel.from_pretrained(tmp_path, attn_implementation="sdpa", dtype=torch.float64).eval()
    assert nys.config.nystrom_attention == {"num_landmarks": N, "pinv": "exact"}
    ids, mask = padded_batch([N, 5])
    real = mask.bool()
    a = nys(ids, attention_mask=mask).last_hidden_state
    assert rel(a[real], ref(ids, attention_mask=mask).last_hidden_state[real]) <= 1e-12


def test_decoder_and_causal_layers_raise():
    ids = torch.randint(2, 50, (1, 8))
    decoder = BertModel._from_config(bert_config(is_decoder=True), attn_implementation="nystrom")
    with pytest.raises(ValueError, match="bidirectional"):
        decoder(ids)
    layer = (
        BertModel._from_config(bert_config(), attn_implementation="nystrom").encoder.layer[0].attention.self
    )
    q = torch.randn(1, 4, 8, 8)
    layer.is_causal = True
    with pytest.raises(ValueError, match="bidirectional"):
        nystrom_attention_forward(layer, q, q, q, None)
    layer.is_causal = False
    with pytest.raises(ValueError, match="bidirectional"):
        nystrom_attention_forward(layer, q, q, q, None, is_causal=True)
    with pytest.raises(ValueError, match="bidirectional"):
        nystrom_mask(1, 8, 8, mask_function=causal_mask_function)


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"landmarks": 8}, ValueError, r"unknown option\(s\) \['landmarks'\].*num_landmarks=64"),
        ({"scale": 0.1}, ValueError, "unknown option"),
        ({"pinv": "svd"}, ValueError, "pinv"),
        ([("num_landmarks", 8)], TypeError, "dict"),
    ],
)
def test_bad_options_raise_clearly(options, error, match):
    nys, _ = pair(BertModel, bert_config(), options)
    with pytest.raises(error, match=match):
        nys(torch.randint(2, 50, (1, 8)))
