"""Long-context conversion (``to_long``, ``nystrom convert long``): copied positions value by value, the
converted folder equal to its transformers source at the source's lengths, and clear errors up front.

Sources are tiny BERT/RoBERTa/XLM-R/Nystromformer models written by transformers itself."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from nystrom.convert.long import DEFAULT_LONG_ATTENTION, long_attention
from nystrom.model import CheckpointError, NystromformerForMaskedLM, source_length, to_long
from nystrom_lab.cli import main as cli_main
from nystrom_lab.cli import run_command as text_main
from nystrom_lab.text.models import load_folder

transformers.logging.set_verbosity_error()
SMALL = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
# fp32 forward of a 2-layer, 32-wide model: outputs of order 1, the same operations in another order
TOL = 1e-5


def write(tmp_path, cls, config, name):
    torch.manual_seed(0)
    model = cls(config).eval()
    folder = tmp_path / name
    model.save_pretrained(folder)
    return model, folder


def bert(tmp_path, cls=transformers.BertForMaskedLM, positions=16):
    return write(tmp_path, cls, transformers.BertConfig(**SMALL, max_position_embeddings=positions), "bert")


def roberta(tmp_path, config_cls=transformers.RobertaConfig, cls=transformers.RobertaForMaskedLM):
    config = config_cls(**SMALL, max_position_embeddings=18, pad_token_id=1)  # 16 positions + 2 reserved
    return write(tmp_path, cls, config, config.model_type)


def right_padded(n: int, low: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(low, 50, (2, n))
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, n - 5 :] = 0
    ids[1, n - 5 :] = 1
    return ids, mask


def test_bert_positions_copied_value_by_value_and_equal_at_source_length(tmp_path):
    hf, folder = bert(tmp_path)
    long = to_long(folder, max_position_embeddings=40, attention="softmax")
    src = hf.bert.embeddings.position_embeddings.weight
    table = long.nystromformer.embeddings.position_embeddings.weight
    assert table.shape == (40, 32)
    for p in range(40):
        assert torch.equal(table[p], src[p % 16]), p
    long.save_pretrained(tmp_path / "long")
    again = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "long")
    assert type(again) is NystromformerForMaskedLM and again.config.max_position_embeddings == 40
    ids, mask = right_padded(16)
    with torch.no_grad():
        want, got = hf(ids, attention_mask=mask).logits, again(ids, attention_mask=mask).logits
    assert (want - got)[mask.bool()].abs().max() <= TOL
    assert again(torch.randint(3, 50, (1, 40))).logits.shape == (1, 40, 50)  # the new length runs


@pytest.mark.parametrize("config_cls,cls", [(transformers.RobertaConfig, transformers.RobertaForMaskedLM),
                                            (transformers.XLMRobertaConfig, transformers.XLMRobertaForMaskedLM)])  # fmt: skip
def test_roberta_family_keeps_two_reserved_rows(tmp_path, config_cls, cls):
    hf, folder = roberta(tmp_path, config_cls, cls)
    assert source_length(folder)[1] == 16
    long = to_long(folder, max_position_embeddings=40, attention="softmax")
    src = hf.roberta.embeddings.position_embeddings.weight  # (18, e): rows 0, 1 reserved
    table = long.nystromformer.embeddings.position_embeddings.weight
    assert long.config.position_offset == 2 and table.shape == (42, 32)
    assert torch.equal(table[:2], src[:2])
    for p in range(40):
        assert torch.equal(table[2 + p], src[2 + p % 16]), p
    ids, mask = right_padded(16)
    with torch.no_grad():
        want, got = hf(ids, attention_mask=mask).logits, long(ids, attention_mask=mask).logits
    assert (want - got)[mask.bool()].abs().max() <= TOL


def test_hf_nystromformer_source(tmp_path):
    config = transformers.NystromformerConfig(**SMALL, max_position_embeddings=16, conv_kernel_size=5,
                                              num_landmarks=4, segment_means_seq_len=4)  # fmt: skip
    hf, folder = write(tmp_path, transformers.NystromformerForMaskedLM, config, "hfnys")
    long = to_long(folder, max_position_embeddings=48)  # keeps HF's own regime: softmax + its trained conv
    assert long.config.attention["name"] == "softmax" and long.config.attention["conv_kernel_size"] == 5
    src = hf.nystromformer.embeddings.position_embeddings.weight  # (16 + 2, e)
    table = long.nystromformer.embeddings.position_embeddings.weight
    for p in range(48):
        assert torch.equal(table[2 + p], src[2 + p % 16]), p
    ids = torch.randint(3, 50, (2, 16))
    with torch.no_grad():
        assert (hf(ids).logits - long(ids).logits).abs().max() <= TOL


def test_new_mlm_head_is_the_same_for_every_attention_and_conv_starts_at_zero(tmp_path):
    _, folder = bert(tmp_path, cls=transformers.BertModel)
    soft = to_long(folder, max_position_embeddings=32, attention="softmax", seed=3)
    nys = to_long(folder, max_position_embeddings=32, attention={"name": "nystrom", "num_landmarks": 4,
                                                                  "conv_kernel_size": 5}, seed=3)  # fmt: skip
    for (k, a), (_, b) in zip(soft.lm_head.state_dict().items(), nys.lm_head.state_dict().items()):
        assert torch.equal(a, b), k
    assert soft.lm_head.decoder.weight.data_ptr() == soft.nystromformer.embeddings.word_embeddings.weight.data_ptr()
    assert float(soft.lm_head.dense.weight.detach().std()) == pytest.approx(0.02, rel=0.15)  # N(0, initializer_range)
    convs = [layer.attention.conv.weight for layer in nys.nystromformer.encoder.layers]
    assert convs and all(not bool(w.any()) for w in convs)


def test_errors_name_the_file_before_any_weight_is_read(tmp_path):
    folder = tmp_path / "cfg-only"  # a config.json and no weights: every check below must fire first
    folder.mkdir()
    cases = [
        ({"model_type": "gpt2"}, CheckpointError, "gpt2"),
        ({"model_type": "roformer"}, CheckpointError, "rotary"),
        ({"model_type": "bert", "position_embedding_type": "relative_key"}, CheckpointError, "relative_key"),
        ({"model_type": "bert", "max_position_embeddings": 64}, ValueError, "above the source's 64"),
    ]
    for cfg, err, text in cases:
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(err, match=text) as info:
            to_long(folder, max_position_embeddings=64)
        assert "config.json" in str(info.value)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json not found"):
        to_long(folder, max_position_embeddings=64)


def test_cli_convert_long_writes_a_folder_with_its_tokenizer(tmp_path, capsys):
    from nystrom_lab.data.text import train_wordpiece

    _, folder = bert(tmp_path, cls=transformers.BertModel)
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\n\nthe dog ran in the park\n" * 5)
    train_wordpiece([corpus], folder / "tokenizer.json", vocab_size=50)
    out = tmp_path / "long"
    code = text_main(["convert", "long", "--init-from", str(folder), "--max-length", "64", "--out", str(out),
                      "--attention", "nystrom-8,conv_kernel_size=3"])  # fmt: skip
    assert code == 0 and "16 rows copied 4.0x" in capsys.readouterr().out
    model = load_folder(out)
    assert type(model) is NystromformerForMaskedLM
    assert model.config.attention == {"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 3}
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 64
    assert transformers.AutoTokenizer.from_pretrained(out)("the cat").input_ids[0] is not None
    keys = load_file(out / "model.safetensors")
    assert keys["nystromformer.embeddings.position_embeddings.weight"].shape == (64, 32)
    assert cli_main(["convert", "long", "--init-from", str(folder), "--max-length", "16", "--out", str(tmp_path / "x")]) == 2
    assert "must be above the source's 16 positions" in capsys.readouterr().err
    assert not (tmp_path / "x" / "config.json").exists()


def test_a_bert_family_source_defaults_to_windows_below_and_nystrom_above(tmp_path, capsys):
    # the position-schemes screen: Nyström in every layer dropped a converted MiniLM from 26.3 % to 10.5 % dev MLM accuracy
    # before training; windows of L - 1 tokens in the lower half kept 25.3 %
    assert (
        long_attention(6, 512)
        == [{"name": "longformer", "window_size": 511}] * 3 + [DEFAULT_LONG_ATTENTION] * 3
    )
    assert long_attention(3, 17) == [{"name": "longformer", "window_size": 15}] + [DEFAULT_LONG_ATTENTION] * 2
    with pytest.raises(ValueError, match="at least 3 positions"):
        long_attention(2, 2)
    _, folder = bert(tmp_path)  # 2 layers, 16 positions
    assert to_long(folder, max_position_embeddings=64).config.attention == [
        {"name": "longformer", "window_size": 15}, DEFAULT_LONG_ATTENTION,
    ]  # fmt: skip
    code = text_main(
        ["convert", "long", "--init-from", str(folder), "--max-length", "64", "--out", str(tmp_path / "l")]
    )
    assert code == 0 and "(longformer nystrom, 64 positions" in capsys.readouterr().out
    assert load_folder(tmp_path / "l").config.attention[0] == {"name": "longformer", "window_size": 15}
