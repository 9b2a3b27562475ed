"""Parity with ``transformers``' Nystromformer: loading its folders, writing folders it loads, bad folders."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from nystrom.model import (
    CheckpointError,
    NystromformerConfig,
    NystromformerForMaskedLM,
    NystromformerForSequenceClassification,
    NystromformerModel,
    from_hf,
)

transformers.logging.set_verbosity_error()
N = 32  # tokens; also HF's segment_means_seq_len in the Nyström regime


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def hf_folder(tmp_path, cls, *, nystrom: bool, seed: int = 0):
    """A random HF model with large weights (peaked attention, so approximations show) saved to a folder."""
    torch.manual_seed(seed)
    kw = dict(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        conv_kernel_size=5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    if nystrom:
        kw.update(num_landmarks=8, segment_means_seq_len=N)
    model = cls(transformers.NystromformerConfig(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "key.weight")):
                p.normal_(0, 0.5)
    folder = tmp_path / f"hf_{cls.__name__}_{nystrom}"
    model.save_pretrained(folder)
    return model, folder


HF_HEADS = ["NystromformerModel", "NystromformerForMaskedLM", "NystromformerForSequenceClassification",
            "NystromformerForTokenClassification", "NystromformerForQuestionAnswering",
            "NystromformerForMultipleChoice"]  # fmt: skip
OUTPUT = {"NystromformerModel": "last_hidden_state", "NystromformerForQuestionAnswering": "start_logits"}


def _inputs(cls_name: str, batch: int) -> torch.Tensor:
    return torch.randint(0, 60, (batch, 2, N) if cls_name.endswith("MultipleChoice") else (batch * 2, N))


@pytest.mark.parametrize("nystrom", [False, True], ids=["hf-exact-regime", "true-nystrom"])
@pytest.mark.parametrize("cls_name", HF_HEADS)
def test_from_hf_matches_transformers(tmp_path, nystrom, cls_name):
    hf, folder = hf_folder(tmp_path, getattr(transformers, cls_name), nystrom=nystrom)
    ours = from_hf(folder)
    assert type(ours).__name__ == cls_name
    expected_att = "nystrom" if nystrom else "softmax"
    assert ours.config.attention["name"] == expected_att and ours.config.attention["conv_kernel_size"] == 5
    # HF's Nyström branch mixes samples (batch-wide Z0 scale): it is only right for one sequence
    ids = torch.randint(0, 60, (1, 1, N) if cls_name.endswith("MultipleChoice") else (1, N)) if nystrom else _inputs(cls_name, 2)
    with torch.no_grad():
        h, o = hf(ids), ours(ids)
    field = OUTPUT.get(cls_name, "logits")
    err = rel_err(getattr(o, field), getattr(h, field))
    print(f"{cls_name} {expected_att}: max rel err {err:.2e}")
    assert err <= 1e-5
    if nystrom and cls_name == "NystromformerForMaskedLM":  # the regime matters: exact attention differs
        exact = from_hf(folder, attention="softmax")
        with torch.no_grad():
            assert rel_err(getattr(exact(ids), field), getattr(h, field)) > 1e-3


@pytest.mark.parametrize("nystrom", [False, True], ids=["hf-exact-regime", "true-nystrom"])
@pytest.mark.parametrize("cls_name", HF_HEADS)
def test_hf_to_ours_to_hf_is_lossless(tmp_path, nystrom, cls_name):
    """Config fields and every tensor survive HF -> ours -> HF; stock transformers loads the result with no
    missing or unexpected keys and computes what the original does."""
    hf, folder = hf_folder(tmp_path, getattr(transformers, cls_name), nystrom=nystrom)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left out
        from_hf(folder).to_hf(tmp_path / "back")
    drop = ("transformers_version",)
    original = {k: v for k, v in json.loads((folder / "config.json").read_text()).items() if k not in drop}
    written = {k: v for k, v in json.loads((tmp_path / "back" / "config.json").read_text()).items() if k not in drop}
    assert written == original
    before, after = load_file(str(folder / "model.safetensors")), load_file(str(tmp_path / "back" / "model.safetensors"))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    again, info = getattr(transformers, cls_name).from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = _inputs(cls_name, 1)
    field = OUTPUT.get(cls_name, "logits")
    with torch.no_grad():
        # same weights, bit for bit; outputs may differ by MKL's alignment-dependent sums (~1e-12)
        torch.testing.assert_close(getattr(again.eval()(ids), field), getattr(hf(ids), field), rtol=1e-6, atol=0)


def test_attention_override_keeps_checkpoint_conv(tmp_path):
    _, folder = hf_folder(tmp_path, transformers.NystromformerModel, nystrom=False)
    ours = from_hf(folder, attention={"name": "nystrom", "num_landmarks": 8, "pinv_init": "original"})
    assert ours.config.attention == {
        "name": "nystrom",
        "num_landmarks": 8,
        "pinv_init": "original",
        "conv_kernel_size": 5,
    }
    with pytest.raises(CheckpointError, match=r"unexpected keys: .*attention\.self\.conv\.weight"):
        from_hf(folder, attention={"name": "softmax", "conv_kernel_size": None})


@pytest.mark.parametrize(
    "attention",
    ["softmax", {"name": "nystrom", "num_landmarks": 8, "pinv_init": "original", "conv_kernel_size": 3}],
    ids=["softmax-noconv", "nystrom"],
)
def test_to_hf_round_trip(tmp_path, attention):
    torch.manual_seed(1)
    cfg = NystromformerConfig.preset(
        "bert-small",
        vocab_size=70,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=48,
        num_hidden_layers=2,
        max_position_embeddings=N,
        attention=attention,
        hidden_act="gelu",
        dropout=0.0,
    )
    ours = NystromformerForMaskedLM(cfg).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("qkv.weight"):
                p.normal_(0, 0.5)
    ours.to_hf(tmp_path / "out")
    hf = transformers.NystromformerForMaskedLM.from_pretrained(tmp_path / "out").eval()
    ids, types = torch.randint(0, 70, (1, N)), torch.randint(0, 2, (1, N))
    with torch.no_grad():
        expected = ours(ids, token_type_ids=types).logits
        err = rel_err(hf(ids, token_type_ids=types).logits, expected)
        back = from_hf(tmp_path / "out")
        assert type(back) is NystromformerForMaskedLM and back.config.definition() == cfg.definition()
        torch.testing.assert_close(back(ids, token_type_ids=types).logits, expected, rtol=0, atol=0)
    print(f"to_hf -> transformers ({cfg.attention['name']}): max rel err {err:.2e}")
    assert err <= 1e-5


def test_to_hf_classifier_round_trip_and_hf_loads_encoder(tmp_path):
    torch.manual_seed(2)
    cfg = NystromformerConfig.preset(
        "bert-small", vocab_size=70, hidden_size=32, num_attention_heads=4, intermediate_size=48,
        num_hidden_layers=1, attention="softmax", num_labels=3, pooling="mean",
    )  # fmt: skip
    ours = NystromformerForSequenceClassification(cfg).eval()
    ours.to_hf(tmp_path / "cls")
    ids = torch.randint(0, 70, (2, 20))
    back = from_hf(tmp_path / "cls")
    assert type(back) is NystromformerForSequenceClassification
    torch.testing.assert_close(back(ids).logits, ours(ids).logits, rtol=0, atol=0)
    hf = transformers.NystromformerModel.from_pretrained(tmp_path / "cls").eval()
    with torch.no_grad():
        assert rel_err(hf(ids).last_hidden_state, ours.nystromformer(ids).last_hidden_state) <= 1e-5


def test_to_hf_refuses_what_hf_cannot_run(tmp_path):
    lra = NystromformerForSequenceClassification(
        NystromformerConfig.preset("lra", max_position_embeddings=64)
    )
    with pytest.raises(ValueError, match="post-LN"):
        lra.to_hf(tmp_path / "x")
    per_matrix = NystromformerModel(NystromformerConfig.preset("bert-small", num_hidden_layers=1))
    with pytest.raises(ValueError, match="pinv_init"):
        per_matrix.to_hf(tmp_path / "y")


def test_pytorch_bin_with_legacy_decoder_keys(tmp_path):
    hf, folder = hf_folder(tmp_path, transformers.NystromformerForMaskedLM, nystrom=False)
    state = load_file(str(folder / "model.safetensors"))
    state["cls.predictions.decoder.weight"] = state["nystromformer.embeddings.word_embeddings.weight"].clone()
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    state["nystromformer.embeddings.position_ids"] = torch.arange(42)[None]
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    ids = torch.randint(0, 60, (2, N))
    with torch.no_grad():
        assert rel_err(from_hf(folder)(ids).logits, hf(ids).logits) <= 1e-5
    state["cls.predictions.decoder.weight"] += 1.0  # an untied decoder is not what the model computes
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"unexpected keys: cls\.predictions\.decoder\.weight"):
        from_hf(folder)


def test_corrupt_and_mismatched_checkpoints(tmp_path):
    _, folder = hf_folder(tmp_path, transformers.NystromformerModel, nystrom=False)
    state = load_file(str(folder / "model.safetensors"))
    broken = dict(state)
    broken.pop("encoder.layer.1.attention.self.key.bias")
    broken["encoder.layer.0.output.dense.weight"] = torch.zeros(32, 63)
    broken["encoder.layer.0.attention.self.extra"] = torch.zeros(1)
    save_file(broken, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as info:
        from_hf(folder)
    msg = str(info.value)
    assert "missing keys: encoder.layer.1.attention.self.key.bias" in msg
    assert "unexpected keys: encoder.layer.0.attention.self.extra" in msg
    assert (
        "encoder.layer.0.output.dense.weight -> encoder.layers.0.ffn.dense_out.weight: checkpoint (32, 63)"
        in msg
    )
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot read weights"):
        from_hf(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights in"):
        from_hf(folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    with pytest.raises(CheckpointError, match="from_bert"):
        from_hf(folder)
    with pytest.raises(CheckpointError, match="does not exist"):
        from_hf(tmp_path / "nowhere")


@pytest.mark.parametrize("cls_name", HF_HEADS[2:])
def test_our_heads_go_to_transformers_and_back(tmp_path, cls_name):
    """A head of ours with HF's head shape (cls pooling, classifier act = hidden_act): transformers loads the
    folder to_hf writes with no missing or unexpected keys and computes the same; from_hf restores ours."""
    torch.manual_seed(3)
    cfg = NystromformerConfig.preset(
        "bert-small", vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=48,
        num_hidden_layers=2, max_position_embeddings=N, pooler=False, pooling="cls", classifier_act="gelu_new",
        attention={"name": "softmax", "conv_kernel_size": 5}, dropout=0.0, num_labels=3,
    )  # fmt: skip
    import nystrom.model as ours_module

    ours = getattr(ours_module, cls_name)(cfg).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours.to_hf(tmp_path / "hf")
    hf, info = getattr(transformers, cls_name).from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = _inputs(cls_name, 2)
    field = OUTPUT.get(cls_name, "logits")
    with torch.no_grad():
        assert rel_err(getattr(hf.eval()(ids), field), getattr(ours(ids), field)) <= 1e-5
        back = from_hf(tmp_path / "hf")
        assert type(back) is type(ours) and back.config.definition() == cfg.definition()
        torch.testing.assert_close(getattr(back(ids), field), getattr(ours(ids), field), rtol=1e-6, atol=0)


def test_shard_index_names_must_stay_in_the_folder(tmp_path):
    _, folder = hf_folder(tmp_path, transformers.NystromformerModel, nystrom=False)
    (folder / "model.safetensors").rename(folder / "part-1.safetensors")
    for bad in ("../../x.safetensors", str(tmp_path / "abs.safetensors"), "sub/../../x.safetensors"):
        index = {"metadata": {}, "weight_map": {"embeddings.word_embeddings.weight": bad}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(CheckpointError, match="not a file inside"):
            from_hf(folder)
    state = load_file(str(folder / "part-1.safetensors"))
    index = {"metadata": {}, "weight_map": dict.fromkeys(state, "part-1.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert type(from_hf(folder)).__name__ == "NystromformerModel"  # a sharded folder loads


def test_our_config_class_refuses_transformers_nystromformer_folders(tmp_path):
    _, folder = hf_folder(tmp_path, transformers.NystromformerModel, nystrom=False)
    with pytest.raises(ValueError, match=r"model_type 'nystromformer'.*nystrom\.from_hf"):
        NystromformerModel.from_pretrained(folder)
