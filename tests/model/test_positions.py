"""Position schemes of ``to_long``: copy, interpolate and Su's hierarchical decomposition value by
value, the scheme recorded in the config, and every bad scheme or α refused before a weight is read."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from nystrom.model import NystromformerForMaskedLM, to_long
from nystrom.model.positions import POSITION_SCHEMES, check_scheme, extend_table
from nystrom_lab.argtypes import UsageError
from nystrom_lab.cli import run_command

transformers.logging.set_verbosity_error()
SMALL = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip


@pytest.fixture
def table():
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_copy_takes_row_p_mod_l(table):
    out = extend_table(table, 40, scheme="copy")
    assert out.shape == (40, 8)
    for p in range(40):
        assert torch.equal(out[p], table[p % 16])


def test_interpolate_hits_the_ends_and_lies_between_rows(table):
    out = extend_table(table, 46, scheme="interpolate")  # x = p·15/45 = p/3
    assert torch.equal(out[0], table[0]) and torch.allclose(out[45], table[15], atol=1e-12)
    for p in range(46):
        x = p / 3
        lo = min(int(x), 14)
        want = table[lo] + (x - lo) * (table[lo + 1] - table[lo])
        torch.testing.assert_close(out[p], want, rtol=0, atol=1e-12)
    assert len({tuple(r.tolist()) for r in out}) == 46  # no two positions share a vector


@pytest.mark.parametrize("alpha", [0.1, 0.4, 0.9])
def test_hierarchical_keeps_the_source_rows_and_follows_su(table, alpha):
    out = extend_table(table, 64, scheme="hierarchical", alpha=alpha)
    torch.testing.assert_close(out[:16], table, rtol=0, atol=1e-12)  # rows below L: the source exactly
    u = (table - alpha * table[0]) / (1 - alpha)
    for i in range(4):
        for j in range(16):
            torch.testing.assert_close(out[i * 16 + j], alpha * u[i] + (1 - alpha) * u[j], rtol=0, atol=1e-12)
    assert not torch.allclose(out[16:32], table)  # the copies are told apart


def test_hierarchical_default_alpha_and_the_l_squared_limit(table):
    torch.testing.assert_close(
        extend_table(table, 32, scheme="hierarchical"),
        extend_table(table, 32, scheme="hierarchical", alpha=0.4),
    )
    extend_table(table, 256, scheme="hierarchical")
    with pytest.raises(ValueError, match="at most L² = 256"):
        extend_table(table, 257, scheme="hierarchical")


def test_shorter_keeps_the_first_rows_and_dtype_is_kept(table):
    half = table.to(torch.bfloat16)
    for scheme in POSITION_SCHEMES:
        assert torch.equal(extend_table(table, 5, scheme=scheme), table[:5])
        assert extend_table(half, 40, scheme=scheme).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("scheme", "alpha", "match"),
    [("tile", None, "positions must be one of"), ("copy", 0.4, "alpha applies to positions='hierarchical'"),
     ("hierarchical", 0.0, r"alpha must be a float in \(0, 1\)"), ("hierarchical", 1.0, "alpha must be"),
     ("hierarchical", True, "alpha must be"), ("hierarchical", float("nan"), "alpha must be")],
)  # fmt: skip
def test_bad_scheme_or_alpha(scheme, alpha, match):
    with pytest.raises(ValueError, match=match):
        check_scheme(scheme, alpha)


def bert_folder(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**SMALL, max_position_embeddings=16)).eval()
    hf.save_pretrained(tmp_path / "bert")
    return hf, tmp_path / "bert"


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_to_long_applies_and_records_the_scheme_and_it_round_trips(tmp_path, scheme):
    hf, folder = bert_folder(tmp_path)
    long = to_long(folder, max_position_embeddings=64, attention="softmax", positions=scheme)
    src = hf.bert.embeddings.position_embeddings.weight.detach()
    table = long.nystromformer.embeddings.position_embeddings.weight.detach()
    torch.testing.assert_close(table, extend_table(src, 64, scheme=scheme), rtol=0, atol=0)
    want = {"scheme": scheme, "source_length": 16, **({"alpha": 0.4} if scheme == "hierarchical" else {})}
    assert long.config.position_extension == want
    long.save_pretrained(tmp_path / "long")
    assert json.loads((tmp_path / "long" / "config.json").read_text())["position_extension"] == want
    back = NystromformerForMaskedLM.from_pretrained(tmp_path / "long")
    assert back.config.position_extension == want
    assert torch.equal(back.nystromformer.embeddings.position_embeddings.weight, table)


def test_hierarchical_long_model_equals_the_source_below_l(tmp_path):
    hf, folder = bert_folder(tmp_path)
    long = to_long(
        folder, max_position_embeddings=64, attention="softmax", positions="hierarchical", alpha=0.3
    )
    ids = torch.randint(3, 50, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(long(ids).logits, hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"positions": "tile"}, "positions must be one of"), ({"positions": "copy", "alpha": 0.5}, "alpha applies"),
     ({"positions": "hierarchical", "alpha": 2.0}, "alpha must be"),
     ({"positions": "hierarchical", "max_position_embeddings": 300}, "at most L² = 256")],
)  # fmt: skip
def test_bad_scheme_fails_before_any_weight_is_read(tmp_path, kw, match):
    _, folder = bert_folder(tmp_path)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")  # reading it would fail otherwise
    kw = {"max_position_embeddings": 64, **kw}
    with pytest.raises(ValueError, match=match):
        to_long(folder, attention="softmax", **kw)


def test_resize_back_within_the_source_clears_the_record(tmp_path):
    _, folder = bert_folder(tmp_path)
    long = to_long(folder, max_position_embeddings=64, attention="softmax", positions="interpolate")
    long.resize_position_embeddings(16)
    assert long.config.position_extension is None


def test_cli_convert_long_positions(tmp_path):
    _, folder = bert_folder(tmp_path)
    out = tmp_path / "out"
    args = ["convert", "long", "--init-from", str(folder), "--max-length", "64", "--attention", "softmax"]
    with pytest.raises(UsageError, match="alpha must be a float in"):  # before anything is read or written
        run_command([*args, "--out", str(out), "--positions", "hierarchical", "--alpha", "1.5"])
    assert not out.exists()
    with pytest.raises(UsageError, match="alpha applies to positions='hierarchical' only"):
        run_command([*args, "--out", str(out), "--positions", "copy", "--alpha", "0.2"])
    run_command([*args, "--out", str(out), "--positions", "hierarchical", "--alpha", "0.25"])
    config = json.loads((out / "config.json").read_text())
    assert config["position_extension"] == {"scheme": "hierarchical", "source_length": 16, "alpha": 0.25}


def test_cli_lists_the_library_schemes():
    from nystrom_lab.text import convert

    assert convert.POSITION_SCHEMES == POSITION_SCHEMES


def test_cli_convert_long_one_attention_per_layer(tmp_path):
    _, folder = bert_folder(tmp_path)  # 2 layers
    out = tmp_path / "out"
    args = ["convert", "long", "--init-from", str(folder), "--max-length", "64", "--out", str(out)]
    run_command([*args, "--attention", "longformer-9", "nystrom-8,pinv=exact"])
    config = json.loads((out / "config.json").read_text())
    assert config["attention"] == [
        {"name": "longformer", "window_size": 9},
        {"name": "nystrom", "num_landmarks": 8, "pinv": "exact", "conv_kernel_size": 65},
    ]
    (folder / "model.safetensors").write_bytes(b"not read")  # the count is checked before any weight is read
    with pytest.raises(ValueError, match="a list of 3 specs but the source has 2 layers"):
        run_command([*args[:-1], str(tmp_path / "out3"), "--attention", "softmax", "softmax", "softmax"])
    assert not (tmp_path / "out3").exists()
