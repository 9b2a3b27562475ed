"""The named configurations of :meth:`NystromformerConfig.preset` as plain data (importable without
transformers or torch: the command line checks ``--model`` against them)."""

from __future__ import annotations

from typing import Any

_BERT_COMMON: dict[str, Any] = {
    "vocab_size": 30000,  # ALBERT SentencePiece vocabulary, as the released HF checkpoints
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "pad_token_id": 0,
    "hidden_act": "gelu_new",
    "norm_position": "post",
    "embedding_norm": True,
    "final_norm": False,
    "layer_norm_eps": 1e-5,
    "dropout": 0.1,
    "attention": {"name": "nystrom", "num_landmarks": 64, "conv_kernel_size": 65},
    "pooler": True,
    "pooling": "pooler",
}

PRESETS: dict[str, dict[str, Any]] = {
    "lra": {
        "vocab_size": 512,  # tasks override with their own vocabulary and length
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "type_vocab_size": 0,
        "pad_token_id": 0,
        "hidden_act": "gelu",
        "norm_position": "pre",
        "embedding_norm": False,
        "final_norm": True,
        "layer_norm_eps": 1e-5,
        "dropout": 0.1,
        "activation_dropout": 0.1,
        "attention": {"name": "nystrom", "num_landmarks": 64, "pinv_iterations": 6, "conv_kernel_size": 35},
        "pooler": False,
        "pooling": "mean",
        "classifier_hidden": 128,
        "classifier_dropout": 0.0,
        "linear_init": "torch",
    },
    "bert-small": {
        **_BERT_COMMON,
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "intermediate_size": 2048,
    },
    "bert-base": {
        **_BERT_COMMON,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
}
