"""The ONNX Runtime profile bench (nystrom_lab.bench.onnx_profile) on a tiny exported encoder."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from nystrom_lab.bench import onnx_profile


def test_profile_sums_the_kernels_by_operator_type(tiny_onnx_folder, tmp_path, capsys):
    out = tmp_path / "prof"
    assert onnx_profile.main([str(tiny_onnx_folder), "--label", "tiny", "--max-length", "40", "--batch-size", "2",
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

