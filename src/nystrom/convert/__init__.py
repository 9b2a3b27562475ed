"""Conversion and I/O around the models: from and to transformers' Nystromformer (``interop_hf``,
``export_hf``, the shared key mapping ``interop_keys``), BERT/RoBERTa import (``interop_bert``), folders
written before the models were transformers models (``legacy``), long conversion (``long``), moving an
encoder between heads and attention variants (``transfer``), safe checkpoint reading (``weights``),
tokenizer folders (``tokenizer``) and export to ONNX (``onnx_export``: :func:`export_onnx`, Optimum's folder
layout; its helpers in ``onnx_io``; int8 dynamic quantization in ``onnx_quantize``: :func:`quantize_onnx`;
onnx, onnxscript and onnxruntime imported only when it runs). Built on
:mod:`nystrom.model`; the public path for the rest stays ``nystrom.model`` (and ``nystrom``), which
re-exports the entry points."""

from nystrom.convert.onnx_export import export_onnx
from nystrom.convert.onnx_quantize import quantize_onnx

__all__ = ["export_onnx", "quantize_onnx"]
