"""int8 dynamic quantization of an exported model: :func:`quantize_onnx`, ONNX Runtime's
``quantize_dynamic`` with Optimum's file name (``model_quantized.onnx`` beside ``model.onnx``).

Dynamic quantization stores the MatMul weights as int8 (one scale per weight tensor) and quantizes
activations on the fly, call by call, from their own range; everything else stays float32. No calibration
data is needed. What it costs in accuracy depends on the model and the task: measure it on yours
(``python -m nystrom_lab.bench.onnx_int8`` does so for a fine-tuned classifier of ours).
"""

from __future__ import annotations

from pathlib import Path

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
        raise FileNotFoundError(f"{model_path}: no model.onnx there; write one with nystrom.convert.export_onnx")
    out = src.parent / QUANTIZED_NAME if out_path is None else Path(out_path)
    if out.resolve() == src.resolve():
        raise ValueError(f"out_path {out} is the model itself: write the quantized model to another file")
    # per tensor: ONNX Runtime 1.32 refuses per-channel zero points on the q/k/v products' (h, e, d) weights
    # ("MatmulInteger : b zero point is not valid"), the layout that the export gives them
    quantization.quantize_dynamic(
        src, out, op_types_to_quantize=["MatMul"], per_channel=False, weight_type=quantization.QuantType.QInt8
    )
    return out
