"""Shared fixtures of the bench tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_onnx_folder(tmp_path_factory):
    """The folder export_onnx writes for a 2-layer encoder of ours (Nyström, 8 landmarks, conv kernel 3), with
    the If on every token real and each layer's FFN Scan; exported once (about a minute on 2 cores) for the
    benches that read an export."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from nystrom.convert import export_onnx
    from nystrom.model import NystromformerConfig, NystromformerModel

    cfg = NystromformerConfig.preset(
        "bert-small", vocab_size=60, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        num_hidden_layers=2, max_position_embeddings=64,
        attention={"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 3},
    )  # fmt: skip
    torch.manual_seed(0)
    model = NystromformerModel(cfg).eval()
    return export_onnx(model, tmp_path_factory.mktemp("tiny-onnx") / "m", progress=False).parent
