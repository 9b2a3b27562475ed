"""int8 dynamic quantization of an exported model: :func:`quantize_onnx`, ONNX Runtime's
``quantize_dynamic`` with Optimum's file name (``model_quantized.onnx`` beside ``model.onnx``).

Dynamic quantization stores the MatMul weights as int8 (one scale per weight tensor) and quantizes
activations on the fly, call by call, from their own range; everything else stays float32. ONNX Runtime's
dynamic quantizer covers ``MatMul`` but not ``Gemm``, the form the export gives the linear layers (their bias
inside, faster in float32): each ``Gemm`` with a constant weight is first written as ``MatMul`` then ``Add``
(:func:`gemms_as_matmuls`), so every linear layer is quantized, in the ``If``'s branches too. No calibration
data is needed. What it costs in accuracy depends on the model and the task: measure it on yours
(``python -m nystrom_lab.bench.onnx_int8`` does so for a fine-tuned classifier of ours).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from nystrom.convert import onnx_io

#: Optimum's name for a quantized model in the export folder (``ORTModel*.from_pretrained(file_name=...)``)
QUANTIZED_NAME = "model_quantized.onnx"


def quantize_onnx(model_path: str | Path, *, out_path: str | Path | None = None) -> Path:
    """Write the int8 dynamic quantization of ``model_path`` (a ``model.onnx`` or the folder holding it).

    Args:
        model_path: what :func:`~nystrom.convert.export_onnx` wrote (the file or its folder).
        out_path: where to write; default ``model_quantized.onnx`` beside the source.

    Returns:
        the path written. Raises ImportError without onnxruntime, FileNotFoundError for a missing model.
    """
    onnx_io.require("onnxruntime")
    from onnxruntime import quantization

    src = Path(model_path)
    if src.is_dir():
        src = src / "model.onnx"
    if not src.is_file():
        raise FileNotFoundError(
            f"{model_path}: no model.onnx there; write one with nystrom.convert.export_onnx"
        )
    out = src.parent / QUANTIZED_NAME if out_path is None else Path(out_path)
    if out.resolve() == src.resolve():
        raise ValueError(f"out_path {out} is the model itself: write the quantized model to another file")
    import onnx

    model = onnx.load(str(src))  # with its weights: rewritten Gemm weights are new tensors
    gemms_as_matmuls(model)
    # per tensor: ONNX Runtime 1.32 refuses per-channel zero points on the q/k/v products' (h, e, d) weights
    # ("MatmulInteger : b zero point is not valid"), the layout that the export gives them
    large = sum(len(t.raw_data) for t in model.graph.initializer) >= onnx.checker.MAXIMUM_PROTOBUF - 2**20
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "model.onnx"
        onnx.save(model, str(plain), save_as_external_data=large)
        quantization.quantize_dynamic(
            plain,
            out,
            use_external_data_format=large,
            op_types_to_quantize=["MatMul"],
            per_channel=False,
            weight_type=quantization.QuantType.QInt8,
            extra_options={"EnableSubgraph": True},  # the If's branches (onnx_graph) hold every MatMul
        )
    return out


def gemms_as_matmuls(model: Any) -> int:
    """Rewrite in place every ``Gemm`` (alpha = beta = 1, A not transposed) whose weight B is an initializer as
    ``MatMul(A, B')`` then ``Add(·, C)`` (B' = B transposed where ``transB``, a new initializer), in the graph
    and its subgraphs. Returns how many were rewritten."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    weights = {t.name: t for t in model.graph.initializer}
    # weights replaced by their transpose (dropped below where nothing else reads them)
    transposed: set[str] = set()

    def attrs(node) -> dict[str, Any]:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def rewrite(graph) -> int:
        done = 0
        nodes = list(graph.node)
        del graph.node[:]
        for node in nodes:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    done += rewrite(a.g)
            options = attrs(node) if node.op_type == "Gemm" else {}
            plain = (
                node.op_type == "Gemm" and node.input[1] in weights
                and options.get("alpha", 1.0) == 1.0 and options.get("beta", 1.0) == 1.0
                and not options.get("transA", 0)
            )  # fmt: skip
            if not plain:
                graph.node.append(node)
                continue
            b = node.input[1]
            if options.get("transB", 0):
                t = numpy_helper.from_array(
                    np.ascontiguousarray(numpy_helper.to_array(weights[b]).T), f"{b}.T"
                )
                model.graph.initializer.append(t)
                weights[t.name] = t
                transposed.add(b)
                b = t.name
            has_bias = len(node.input) > 2 and node.input[2] != ""
            product = f"{node.output[0]}.matmul" if has_bias else node.output[0]
            graph.node.append(
                helper.make_node("MatMul", [node.input[0], b], [product], name=f"{node.name}.matmul")
            )
            if has_bias:
                graph.node.append(
                    helper.make_node(
                        "Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}.bias"
                    )
                )
            done += 1
        return done

    def read(graph) -> set[str]:
        return {i for n in graph.node for i in n.input} | {
            i
            for n in graph.node
            for a in n.attribute
            if a.type == onnx.AttributeProto.GRAPH
            for i in read(a.g)
        }

    done = rewrite(model.graph)
    unused = transposed - read(model.graph) - {o.name for o in model.graph.output}
    kept = [t for t in model.graph.initializer if t.name not in unused]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return done
