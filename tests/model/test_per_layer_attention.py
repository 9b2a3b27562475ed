"""Per-layer attention: ``config.attention`` as a list, one spec per layer. It builds, saves,
loads and converts like one spec, and is refused where it cannot go (a wrong length, transformers' class)."""

from __future__ import annotations

import pytest
import torch
import transformers

from nystrom.attention import LongformerAttention, NystromAttention, SoftmaxAttention
from nystrom.model import NystromformerConfig, NystromformerForMaskedLM, NystromformerModel, to_long

transformers.logging.set_verbosity_error()
TINY = dict(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=64, dropout=0.0)  # fmt: skip
LAYERS = [{"name": "longformer", "window_size": 9}, "softmax", {"name": "nystrom", "num_landmarks": 4}]


def test_each_layer_gets_its_own_attention_and_it_round_trips(tmp_path):
    config = NystromformerConfig(**TINY, attention=LAYERS)
    assert config.per_layer_attention and config.layer_attention(1) == {"name": "softmax"}
    torch.manual_seed(0)
    model = NystromformerModel(config).eval()
    kinds = [type(layer.attention) for layer in model.encoder.layers]
    assert kinds == [LongformerAttention, SoftmaxAttention, NystromAttention]
    assert model.encoder.layers[0].attention.window_size == 9
    assert model.encoder.layers[2].attention.num_landmarks == 4
    model.save_pretrained(tmp_path / "m")
    back = transformers.AutoModel.from_pretrained(tmp_path / "m").eval()
    assert back.config.attention == config.attention
    ids = torch.randint(3, 50, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).last_hidden_state, model(ids).last_hidden_state, rtol=0, atol=0)


def test_one_spec_for_all_layers_is_unchanged():
    config = NystromformerConfig(**TINY, attention="softmax")
    assert not config.per_layer_attention
    assert all(config.layer_attention(i) == {"name": "softmax"} for i in range(3))


@pytest.mark.parametrize(
    ("attention", "match"),
    [(["softmax", "softmax"], "a list of 2 specs but the model has 3 layers"),
     ([], "needs one spec per layer"),
     (["softmax", "softmax", {"name": "softmax", "window_size": 3}], r"does not accept option\(s\) \['window_size'\]"),
     (["softmax", "softmax", "flash"], "attention name must be one of")],
)  # fmt: skip
def test_bad_lists_are_refused(attention, match):
    with pytest.raises(ValueError, match=match):
        NystromformerConfig(**TINY, attention=attention)


def test_replace_layers_checks_the_list_length():
    config = NystromformerConfig(**TINY, attention=LAYERS)
    with pytest.raises(ValueError, match="a list of 3 specs but the model has 2 layers"):
        config.replace(num_hidden_layers=2)


def test_to_hf_refuses_per_layer_attention(tmp_path):
    model = NystromformerModel(NystromformerConfig(**TINY, attention=LAYERS))
    with pytest.raises(ValueError, match="one attention in every layer"):
        model.to_hf(tmp_path / "hf")


def test_to_long_with_one_attention_per_layer_keeps_the_lower_layers_exact(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(
        transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                intermediate_size=48, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0)
    ).eval()  # fmt: skip
    hf.save_pretrained(tmp_path / "bert")
    layers = [
        "softmax",
        "softmax",
        {"name": "nystrom", "num_landmarks": 16, "pinv": "exact", "conv_kernel_size": 3},
    ]
    long = to_long(tmp_path / "bert", max_position_embeddings=64, attention=layers)
    assert isinstance(long, NystromformerForMaskedLM)
    assert long.config.attention[2] == layers[2]
    assert long.nystromformer.encoder.layers[2].attention.conv is not None  # a conv skip the source lacks ...
    assert not long.nystromformer.encoder.layers[2].attention.conv.weight.any()  # ... starts at zero
    ids = torch.randint(3, 50, (2, 16))  # n = m and the exact pinv: Nyström is softmax here
    with torch.no_grad():
        torch.testing.assert_close(long(ids).logits, hf(ids).logits, rtol=0, atol=1e-4)


def test_layers_with_different_landmark_counts_share_no_wrong_assignment():
    """The encoder shares each mask's landmark plan across layers (the accelerator path); layers with other m must
    each get their own: the model equals its layers run one by one outside any shared block."""
    layers = [{"name": "nystrom", "num_landmarks": m, "conv_kernel_size": 3} for m in (4, 8, 4)]
    torch.manual_seed(0)
    model = NystromformerModel(NystromformerConfig(**TINY, attention=layers)).eval()
    ids = torch.randint(3, 50, (2, 40))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 29:] = 0
    with torch.no_grad():
        out = model(ids, attention_mask=mask).last_hidden_state
        x = model.embeddings(model.embeddings.word_embeddings(ids))
        for layer in model.encoder.layers:
            x, _ = layer(x, mask.bool())
    torch.testing.assert_close(out[mask.bool()], x[mask.bool()], rtol=0, atol=1e-6)
