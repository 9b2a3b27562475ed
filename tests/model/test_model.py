"""Model-level behaviour: config/presets, heads, masking, position table, old checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from nystrom.model import (
    CheckpointError,
    NystromformerConfig,
    NystromformerForDualSequenceClassification,
    NystromformerForMaskedLM,
    NystromformerForPreTraining,
    NystromformerForSequenceClassification,
    NystromformerModel,
    convert_legacy_checkpoint,
)


def small(**overrides) -> NystromformerConfig:
    base = dict(vocab_size=50, max_position_embeddings=64, num_labels=3, dropout=0.0, activation_dropout=0.0)
    return NystromformerConfig.preset("lra", **{**base, **overrides})


def test_presets_match_the_paper():
    lra = NystromformerConfig.preset("lra")
    assert (lra.num_hidden_layers, lra.hidden_size, lra.intermediate_size, lra.num_attention_heads) == (
        2,
        64,
        128,
        2,
    )
    assert (lra.norm_position, lra.final_norm, lra.pooling, lra.classifier_hidden) == (
        "pre",
        True,
        "mean",
        128,
    )
    assert lra.attention == {
        "name": "nystrom",
        "num_landmarks": 64,
        "pinv_iterations": 6,
        "conv_kernel_size": 35,
    }
    small_ = NystromformerConfig.preset("bert-small")
    assert (small_.num_hidden_layers, small_.hidden_size, small_.num_attention_heads) == (4, 512, 8)
    base = NystromformerConfig.preset("bert-base")
    assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size, base.norm_position) == (
        12,
        768,
        3072,
        "post",
    )
    assert NystromformerConfig.preset("lra", attention="softmax").attention == {"name": "softmax"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"foo": 1}, "not config fields"),
        ({"attention": {"name": "nystrom", "landmarks": 8}}, "does not accept option"),
        ({"attention": "nope"}, "attention name must be one of"),
        ({"hidden_size": 63}, "divisible by num_attention_heads"),
        ({"hidden_act": "swish"}, "hidden_act"),
        ({"pooling": "pooler"}, "pooler=True"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NystromformerConfig.preset("lra", **kwargs)
    with pytest.raises(ValueError, match="unknown preset"):
        NystromformerConfig.preset("bert-huge")


def test_config_json_round_trip(tmp_path):
    cfg = small(attention={"name": "nystrom", "num_landmarks": 8, "pinv_init": "original"})
    cfg.save_pretrained(tmp_path)
    back = NystromformerConfig.from_pretrained(tmp_path)
    assert back.definition() == cfg.definition() and back.attention == cfg.attention
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "nystrom-nystromformer"
    assert cfg.replace(num_labels=5).num_labels == 5 and cfg.replace(hidden_dropout_prob=0.3).dropout == 0.3


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("hidden_size", True, "hidden_size must be an int"),
        ("num_hidden_layers", 2.0, "num_hidden_layers must be an int"),
        ("pad_token_id", False, "pad_token_id must be None or an int"),
        ("dropout", True, "dropout must be a float"),
        ("layer_norm_eps", float("nan"), "layer_norm_eps must be a positive float"),
        ("qkv_bias", 1, "qkv_bias must be a bool"),
        ("classifier_act", "tanh", "classifier_act must be one of"),
    ],
)
def test_config_types_bools_are_not_ints(field, value, match):
    with pytest.raises((ValueError, TypeError), match=match):
        NystromformerConfig.preset("lra", **{field: value})


def test_config_refuses_attention_probability_dropout():
    with pytest.raises(ValueError, match="attention_probs_dropout_prob is not supported"):
        NystromformerConfig(attention_probs_dropout_prob=0.1)
    assert NystromformerConfig(attention_probs_dropout_prob=0.0).dropout == 0.1


@pytest.mark.parametrize(
    "attention", ["softmax", {"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 5}]
)
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_padding_invariance(attention, norm):
    torch.manual_seed(0)
    model = NystromformerModel(
        small(attention=attention, norm_position=norm, final_norm=norm == "pre")
    ).eval()
    lengths, n = [23, 40, 9], 40
    samples = [torch.randint(1, 50, (1, L)) for L in lengths]
    ids = torch.zeros(3, n, dtype=torch.long)
    mask = torch.zeros(3, n, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : s.shape[1]], mask[i, : s.shape[1]] = s[0], 1
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).last_hidden_state
        garbage = ids.masked_fill(mask == 0, 7) + (1 - mask) * torch.randint(0, 40, ids.shape)
        batched_garbage = model(garbage, attention_mask=mask.bool()).last_hidden_state
        for i, s in enumerate(samples):
            alone = model(s).last_hidden_state[0]
            torch.testing.assert_close(batched[i, : s.shape[1]], alone, rtol=1e-5, atol=1e-5)
    real = mask.bool()
    torch.testing.assert_close(batched[real], batched_garbage[real], rtol=0, atol=0)


def test_pooling_modes_mask_padding():
    torch.manual_seed(0)
    ids = torch.randint(1, 50, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 5:] = 0
    for pooling in ("mean", "cls", "mean_with_padding"):
        model = NystromformerForSequenceClassification(small(attention="softmax", pooling=pooling)).eval()
        with torch.no_grad():
            out = model(ids, attention_mask=mask, output_hidden_states=True)
            h = out.hidden_states[-1]
            feats = {
                "mean": h[1, :5].mean(0),
                "cls": h[1, 0],
                "mean_with_padding": h[1, :5].sum(0) / 12,  # official LRA: padding zeroed but counted
            }[pooling]
            expected = model.classifier(feats[None])[0]
        torch.testing.assert_close(out.logits[1], expected, rtol=1e-5, atol=1e-6)


def test_heads_shapes_and_losses():
    torch.manual_seed(0)
    cfg = NystromformerConfig.preset(
        "bert-small",
        vocab_size=40,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        num_hidden_layers=1,
        max_position_embeddings=32,
        attention="softmax",
        dropout=0.0,
    )
    ids, types = torch.randint(0, 40, (2, 16)), torch.randint(0, 2, (2, 16))
    labels = torch.full((2, 16), -100)
    labels[:, 3] = ids[:, 3]
    mlm = NystromformerForMaskedLM(cfg).eval()
    out = mlm(ids, token_type_ids=types, labels=labels)
    assert out.logits.shape == (2, 16, 40)
    expected = torch.nn.functional.cross_entropy(out.logits[:, 3], ids[:, 3])
    torch.testing.assert_close(out.loss, expected)
    pre = NystromformerForPreTraining(cfg).eval()
    out = pre(ids, labels=labels, sentence_order_label=torch.tensor([0, 1]))
    assert out.sop_logits.shape == (2, 2) and out.loss.ndim == 0 and out.prediction_logits.shape == (2, 16, 40)
    mlm_only = torch.nn.functional.cross_entropy(out.prediction_logits[:, 3], ids[:, 3])
    sop = torch.nn.functional.cross_entropy(out.sop_logits, torch.tensor([0, 1]))
    torch.testing.assert_close(out.loss, mlm_only + sop)
    with pytest.raises(ValueError, match="pooler=True"):
        NystromformerForPreTraining(small())
    # tied decoder: the MLM logits move when the word embeddings move
    with torch.no_grad():
        before = mlm(ids).logits
        mlm.nystromformer.embeddings.word_embeddings.weight[5] += 1.0
        assert not torch.allclose(before[..., 5], mlm(ids).logits[..., 5])


def test_dual_model_uses_one_encoder_and_four_features():
    torch.manual_seed(0)
    model = NystromformerForDualSequenceClassification(small(attention="softmax")).eval()
    a, b = torch.randint(1, 50, (2, 20)), torch.randint(1, 50, (2, 14))
    mb = torch.ones(2, 14, dtype=torch.bool)
    mb[0, 10:] = False
    with torch.no_grad():
        out = model(a, b, attention_mask_2=mb, labels=torch.tensor([0, 1]))
        pa = model.nystromformer(a).last_hidden_state.mean(1)
        hb = model.nystromformer(b, attention_mask=mb).last_hidden_state
        pb = torch.stack([hb[0, :10].mean(0), hb[1].mean(0)])
        expected = model.classifier(torch.cat([pa, pb, pa * pb, pa - pb], -1))
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-6)
    assert out.last_hidden_state_1.shape == (2, 20, 64) and out.last_hidden_state_2.shape == (2, 14, 64)
    assert out.loss is not None and out.loss.item() > 0


def test_input_validation_errors():
    model = NystromformerModel(small(attention="softmax")).eval()
    ids = torch.randint(1, 50, (2, 10))
    with pytest.raises(ValueError, match="only 0 .padding. and 1"):
        model(ids, attention_mask=torch.full((2, 10), 2))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, tokens\) = \(2, 10\)"):
        model(ids, attention_mask=torch.ones(2, 9))
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 50\)"):
        model(ids + 100)
    with pytest.raises(ValueError, match="no token-type table"):
        model(ids, token_type_ids=torch.ones_like(ids))
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        model()
    with pytest.raises(ValueError, match=r"resize_position_embeddings\(65\)"):
        model(torch.randint(1, 50, (1, 65)))


def test_resize_position_embeddings_tiles_rows():
    torch.manual_seed(0)
    model = NystromformerForSequenceClassification(
        small(max_position_embeddings=16, attention="softmax")
    ).eval()
    old = model.nystromformer.embeddings.position_embeddings.weight.detach().clone()
    model.resize_position_embeddings(40)
    new = model.nystromformer.embeddings.position_embeddings.weight
    assert new.shape == (40, 64) and model.config.max_position_embeddings == 40
    torch.testing.assert_close(new[16:32], old)
    torch.testing.assert_close(new[32:40], old[:8])
    assert model(torch.randint(1, 50, (1, 40))).logits.shape == (1, 3)


def _legacy_folder(folder, model):
    """A folder as the old native format wrote it: {"format": "nystrom", ...} config, the old head key names."""
    from safetensors.torch import save_file

    folder.mkdir()
    cfg = {k: v for k, v in model.config.definition().items() if k in NystromformerConfig.__dataclass_fields__}
    for k in ("classifier_act", "classifier_dropout", "position_offset", "hf_config", "tie_word_embeddings",
              "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type"):
        cfg.pop(k, None)
    cfg.update(num_labels=model.config.num_labels)
    meta = {"format": "nystrom", "architecture": type(model).__name__, "config": cfg}
    (folder / "config.json").write_text(json.dumps(meta))
    state = {k.replace("classifier.out_proj.", "classifier.out."): v.contiguous()
             for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))


def test_old_folders_fail_with_a_conversion_hint_and_convert(tmp_path):
    import transformers

    torch.manual_seed(0)
    model = NystromformerForSequenceClassification(
        small(attention={"name": "nystrom", "num_landmarks": 4}, classifier_dropout=0.0)
    ).eval()
    _legacy_folder(tmp_path / "old", model)
    with pytest.raises(ValueError, match="convert_legacy_checkpoint"):
        NystromformerForSequenceClassification.from_pretrained(tmp_path / "old")
    convert_legacy_checkpoint(tmp_path / "old", tmp_path / "new")
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "new").eval()
    assert type(loaded) is NystromformerForSequenceClassification
    ids = torch.randint(1, 50, (2, 30))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    with pytest.raises(CheckpointError, match="not an old nystrom checkpoint"):
        convert_legacy_checkpoint(tmp_path / "new", tmp_path / "again")


def test_linear_init_follows_the_official_lra_code():
    from nystrom.model import NystromformerConfig, NystromformerForSequenceClassification

    torch.manual_seed(0)
    lra = NystromformerForSequenceClassification(NystromformerConfig.preset("lra", vocab_size=20))
    qkv = lra.nystromformer.encoder.layers[0].attention.qkv.weight.detach()  # PyTorch default: U(±1/√64)
    assert float(qkv.abs().max()) <= 1 / 8 and 0.06 < float(qkv.std()) < 0.08
    emb = lra.nystromformer.embeddings.word_embeddings.weight.detach()[1:]  # N(0, 0.02) as the official code
    assert 0.015 < float(emb.std()) < 0.025
    bert = NystromformerForSequenceClassification(
        NystromformerConfig.preset("lra", vocab_size=20, linear_init="normal")
    )
    w = bert.nystromformer.encoder.layers[0].attention.qkv.weight.detach()
    assert 0.015 < float(w.std()) < 0.025 and not bool(bert.nystromformer.encoder.layers[0].attention.qkv.bias.any())
    with pytest.raises(ValueError, match="linear_init"):
        NystromformerConfig.preset("lra", linear_init="xavier")


def test_old_configs_without_linear_init_keep_the_old_behaviour(tmp_path):
    model = NystromformerModel(small(attention="softmax", linear_init="normal"))
    _legacy_folder(tmp_path / "old", model)
    meta = json.loads((tmp_path / "old" / "config.json").read_text())
    del meta["config"]["linear_init"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(meta))
    convert_legacy_checkpoint(tmp_path / "old", tmp_path / "new")
    assert NystromformerConfig.from_pretrained(tmp_path / "new").linear_init == "normal"


def test_inference_keeps_no_earlier_layer_input_alive():
    """Regression: the encoder kept every layer's input for ``output_hidden_states`` even when not asked,
    one (b, n, e) tensor per layer alive to the end (at 16384 tokens, MiniLM size: +150 MB of peak)."""
    import gc
    import weakref

    model = NystromformerModel(small(num_hidden_layers=4)).eval()
    inputs: list[weakref.ref] = []
    alive_at_last: list[bool] = []

    def before(layer, args):
        if layer is model.encoder.layers[-1]:
            gc.collect()
            alive_at_last.extend(r() is not None for r in inputs[1:])  # layer 0's input is the caller's
        inputs.append(weakref.ref(args[0]))

    for layer in model.encoder.layers:
        layer.register_forward_pre_hook(before)
    ids = torch.randint(5, 50, (2, 16))
    with torch.inference_mode():
        model(ids)
    assert alive_at_last == [False, False]
    inputs.clear()
    with torch.inference_mode():
        out = model(ids, output_hidden_states=True)
    assert len(out.hidden_states) == 5 and torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert alive_at_last == [False, False, True, True]  # asked for: every input is kept
