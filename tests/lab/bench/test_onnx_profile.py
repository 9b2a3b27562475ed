"""The ONNX Runtime profile bench (nystrom_lab.bench.onnx_profile) on a tiny exported encoder."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from nystrom.convert import export_onnx
from nystrom.model import NystromformerConfig, NystromformerModel
from nystrom_lab.bench import onnx_profile


def test_profile_sums_the_kernels_by_operator_type(tmp_path, capsys):
    cfg = NystromformerConfig.preset(
        "bert-small", vocab_size=60, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        num_hidden_layers=2, max_position_embeddings=64,
        attention={"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 3},
    )  # fmt: skip
    torch.manual_seed(0)
    folder = export_onnx(NystromformerModel(cfg).eval(), tmp_path / "m", progress=False).parent
    out = tmp_path / "prof"
    assert onnx_profile.main([str(folder), "--label", "tiny", "--max-length", "40", "--batch-size", "2",
                              "--calls", "2", "--out", str(out)]) == 0  # fmt: skip
    res = json.loads((out / "onnx_profile.json").read_text())
    (prof,) = res["profiles"]
    assert (prof["label"], prof["tokens"], prof["batch"], len(prof["wall_ms"])) == ("tiny", 40, 2, 2)
    shares = {row["op"]: row["share"] for row in prof["op_types"]}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert "Conv" in shares and "IsNaN" not in shares  # the conv skip is one Conv per layer
    assert sum(row["ms"] for row in prof["op_types"]) == pytest.approx(prof["kernel_ms"])
    assert 0 < len(prof["nodes"]) <= onnx_profile.TOP_NODES
    table = capsys.readouterr().out
    assert "`tiny` at n = 40, b = 2" in table and "| operator | ms per call | share |" in table


def test_a_missing_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        onnx_profile.main([str(tmp_path / "nothing.onnx")])
    assert "is not a file" in capsys.readouterr().err

