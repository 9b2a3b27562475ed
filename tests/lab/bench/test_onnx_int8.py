"""The int8 bench (nystrom_lab.bench.onnx_int8) on a tiny fine-tuned classifier: three engines, one table."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from lab.text.tiny_text import tiny_text_setup
from nystrom_lab.bench import onnx_int8
from nystrom_lab.cli import main as cli_main

TEXTS = {"pos": ["the train reached the coast", "the child counted the cows"],
         "neg": ["the cost grows with the square", "long documents are expensive"]}  # fmt: skip


def test_int8_bench_scores_every_engine_on_the_same_examples(tmp_path, capsys):
    root = tiny_text_setup(tmp_path, max_positions=64)
    rows = [(t, y) for y, ts in TEXTS.items() for t in ts] * 3
    (root / "data.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    assert cli_main([
        "finetune", "--train-file", str(root / "data.csv"), "--validation-file", str(root / "data.csv"),
        "--epochs", "1", "--out", str(tmp_path / "run"), "--init-from", str(root / "tiny.json"), "--tokenizer",
        str(root / "tokenizer.json"), "--attention", "nystrom-4,conv_kernel_size=3", "--batch-size", "4",
        "--no-progress", "--device", "cpu", "--max-length", "32",
    ]) == 0  # fmt: skip
    out = tmp_path / "bench"
    assert onnx_int8.main([str(tmp_path / "run" / "model"), "--test-file", str(root / "data.csv"), "--batch-size",
                           "5", "--rounds", "2", "--out", str(out)]) == 0  # fmt: skip
    res = json.loads((out / "onnx_int8.json").read_text())
    assert (res["examples"], res["batches"], res["rounds"]) == (12, 3, 2)
    by = {r["engine"]: r for r in res["rows"]}
    assert list(by) == list(onnx_int8.ENGINES)
    assert (by["eager"]["differ_from_eager"], by["eager"]["max_logit_diff"]) == (0, 0.0)
    assert by["ort-fp32"]["max_logit_diff"] < 1e-4 and by["ort-fp32"]["accuracy"] == by["eager"]["accuracy"]
    assert by["ort-int8"]["bytes"] < by["ort-fp32"]["bytes"] and len(by["ort-int8"]["totals_s"]) == 2
    assert "| ort-int8 |" in capsys.readouterr().out
