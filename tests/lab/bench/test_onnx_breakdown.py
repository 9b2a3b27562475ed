"""The ORT-against-eager breakdown (nystrom_lab.bench.onnx_breakdown) on a tiny exported encoder."""

from __future__ import annotations

import collections
import json

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import onnx

from nystrom.convert.onnx_graph import all_graphs
from nystrom_lab.bench import onnx_breakdown as bd


def test_linear_nodes_are_the_weight_products_and_their_biases(tiny_onnx_folder):
    model = onnx.load(str(tiny_onnx_folder / "model.onnx"), load_external_data=False)
    names = bd.linear_nodes(model)
    # every subgraph: the If's two branches and each layer's Scan body
    found = collections.Counter(n.op_type for g in all_graphs(model.graph) for n in g.node if n.name in names)
    # per branch and layer: q, k, v products (3 MatMul), q's and v's biases (2 Add; k's is left out), the
    # output projection and the FFN's two (3 Gemm); and one pooler Gemm per branch
    assert found == {"MatMul": 2 * 2 * 3, "Add": 2 * 2 * 2, "Gemm": 2 * 2 * 3 + 2}


def test_categories_of_ops():
    assert bd.torch_category("mkldnn::_linear_pointwise") == bd.LINEAR
    assert bd.torch_category("aten::gelu") == bd.LINEAR
    assert bd.torch_category("aten::_scaled_dot_product_flash_attention_for_cpu") == bd.ATTENTION
    assert bd.torch_category("aten::bmm") == bd.ATTENTION
    assert bd.torch_category("_LongKeyAttention") == bd.ATTENTION  # the CPU kernels' autograd Function
    assert bd.torch_category("aten::copy_") == bd.MOVEMENT
    assert bd.torch_category("aten::native_layer_norm") == bd.ELEMENTWISE
    linear = {"proj"}
    assert bd.ort_category("MatMul", "proj", linear) == bd.LINEAR
    assert bd.ort_category("MatMul", "scores", linear) == bd.ATTENTION
    assert bd.ort_category("Gelu", "act", linear) == bd.LINEAR
    assert bd.ort_category("ReorderInput", "r", linear) == bd.ATTENTION  # the NCHWc conv's own layout
    assert bd.ort_category("Transpose", "t", linear) == bd.MOVEMENT
    assert bd.ort_category("ReduceMean", "ln", linear) == bd.ELEMENTWISE


def test_breakdown_writes_both_engines_by_category(tiny_onnx_folder, tmp_path, capsys):
    out = tmp_path / "bd"
    assert bd.main([str(tiny_onnx_folder), "--max-length", "40", "--batch-size", "2", "--rounds", "2", "--calls", "1",
                    "--settle-s", "0", "--out", str(out)]) == 0  # fmt: skip
    res = json.loads((out / "onnx_breakdown.json").read_text())
    r = res["breakdown"]
    assert (r["tokens"], r["batch"], res["rounds"], res["calls"]) == (40, 2, 2, 1)
    assert {k: len(v) for k, v in r["wall_ms"].items()} == {"eager": 2, "ort": 2}
    for engine in ("eager", "ort"):
        ms = r["ms_per_call"][engine]
        assert list(ms) == list(bd.CATEGORIES)
        assert ms[bd.LINEAR] > 0 and ms[bd.ATTENTION] > 0
    assert r["linear_nodes"] > 0
    table = capsys.readouterr().out
    assert "| category | eager (ms) | ORT (ms) | ORT − eager (ms) |" in table and "**all ops**" in table


def test_a_folder_of_another_model_is_refused(tiny_onnx_folder, tmp_path, capsys):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "model.onnx").write_bytes((tiny_onnx_folder / "model.onnx").read_bytes())
    config = json.loads((tiny_onnx_folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    with pytest.raises(SystemExit):
        bd.main(
            [str(folder), "--max-length", "20", "--rounds", "1", "--calls", "1", "--out", str(tmp_path / "o")]
        )
    assert "'BertModel', not a model of ours" in capsys.readouterr().err


def test_a_folder_without_a_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bd.main([str(tmp_path)])
    assert "holds no model.onnx" in capsys.readouterr().err
