"""HuggingFace Nystromformer checkpoint folders <-> our models (no network, no transformers import).

Legend: e hidden size, h heads, k conv kernel, p position rows, m landmarks.

HF layout (uw-madison/nystromformer-*): ``[nystromformer.]embeddings.{word,position,token_type}_embeddings``
with a position table of p + 2 rows (ids start at 2), ``encoder.layer.{i}.attention.self.{query,key,value}``
(our fused ``qkv`` = their rows concatenated in that order), ``attention.self.conv.weight`` (h, 1, k, 1),
post-LN BERT blocks and the MLM head ``cls.predictions.*`` tied to the word embeddings. The same mapping
serves BERT folders (:mod:`nystrom.model.interop_bert`) with no position offset and no conv; the
rules live in :mod:`nystrom.model.interop_keys`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nystrom.model.checkpoint import CheckpointError, read_json, read_weights
from nystrom.model.config import (
    ACTIVATIONS,
    NystromformerConfig,
    attention_option_names,
    normalize_attention,
    resolved_attention,
)
from nystrom.model.encoder import NystromformerModel, NystromformerPreTrainedModel
from nystrom.model.heads import (
    MODEL_CLASSES,
    NystromformerForMaskedLM,
    NystromformerForPreTraining,
)
from nystrom.model.interop_keys import HF_POSITION_OFFSET, _plan, load_bertlike


# ---------------------------------------------------------------------------------------------- import
def config_from_hf(hf: dict[str, Any], *, source: str) -> NystromformerConfig:
    """Our config for a HF Nystromformer ``config.json`` dict, reproducing HF's attention regime."""
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    absent = [k for k in required if k not in hf]
    if absent:
        raise CheckpointError(f"{source}: missing key(s) {absent}")
    act = hf.get("hidden_act", "gelu_new")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported; expected one of {ACTIVATIONS}")
    conv = hf.get("conv_kernel_size", 65)
    m, seq_len = hf.get("num_landmarks", 64), hf.get("segment_means_seq_len", 64)
    if m == seq_len:  # HF then runs exact softmax attention (+ the conv skip)
        attention: dict[str, Any] = {"name": "softmax", "conv_kernel_size": conv}
    else:  # HF's Nyström branch: batch-wide Z0 scaling, 6 iterations (exact only at n = seq_len)
        init = "per_matrix" if hf.get("inv_coeff_init_option", False) else "original"
        attention = {"name": "nystrom", "num_landmarks": m, "pinv_iterations": 6, "pinv_init": init}
        attention["conv_kernel_size"] = conv
    pad = hf.get("pad_token_id", 1)
    return NystromformerConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 510),
        type_vocab_size=hf.get("type_vocab_size", 2),
        pad_token_id=pad if isinstance(pad, int) and 0 <= pad < hf["vocab_size"] else None,
        hidden_act=act,
        norm_position="post",
        embedding_norm=True,
        final_norm=False,
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        dropout=float(hf.get("hidden_dropout_prob", 0.1)),
        attention=attention,
        pooler=False,
        pooling="cls",
        classifier_hidden=hf["hidden_size"],
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )


def with_attention(
    config: NystromformerConfig, attention: str | dict[str, Any] | None
) -> NystromformerConfig:
    """``config`` with ``attention`` swapped in; a conv kernel the user did not set keeps the checkpoint's."""
    if attention is None:
        return config
    spec = normalize_attention(attention)
    old = resolved_attention(config.attention).get("conv_kernel_size")
    if "conv_kernel_size" not in spec and old is not None:
        if "conv_kernel_size" in attention_option_names(spec["name"]):
            spec["conv_kernel_size"] = old  # the checkpoint carries these conv weights
    return NystromformerConfig.from_dict({**config.to_dict(), "attention": spec})


def from_hf(
    path: str | Path, *, attention: str | dict[str, Any] | None = None
) -> NystromformerPreTrainedModel:
    """Load a HuggingFace Nystromformer folder (``config.json`` + ``model.safetensors``/``pytorch_model.bin``).

    Returns ``NystromformerForMaskedLM`` for a masked-LM checkpoint, ``NystromformerModel`` for a bare
    encoder (folders written by :func:`to_hf` come back as the class that wrote them), in eval mode.
    By default the attention reproduces HF: exact softmax + conv when ``num_landmarks ==
    segment_means_seq_len`` (all published checkpoints), else HF's Nyström settings. ``attention``
    (``"nystrom"`` or ``{"name": "nystrom", "num_landmarks": 64, ...}``) switches variant; an unset
    ``conv_kernel_size`` keeps the checkpoint's kernel.
    """
    folder = Path(path)
    hf = read_json(folder / "config.json")
    if hf.get("model_type") not in (None, "nystromformer"):
        raise CheckpointError(
            f"{folder / 'config.json'}: model_type is {hf.get('model_type')!r}, expected 'nystromformer'"
            " (use nystrom.from_bert for BERT folders)"
        )
    state = read_weights(folder)
    ours = hf.get("nystrom")
    if isinstance(ours, dict):  # written by to_hf: restore the exact class and config
        config = NystromformerConfig.from_dict(
            ours.get("config"), source=f"{folder / 'config.json'} [nystrom]"
        )
        arch = ours.get("architecture")
        if arch not in MODEL_CLASSES:
            raise CheckpointError(f"{folder / 'config.json'}: unknown nystrom.architecture {arch!r}")
        cls = MODEL_CLASSES[arch]
    else:
        config = config_from_hf(hf, source=str(folder / "config.json"))
        cls = (
            NystromformerForMaskedLM
            if any(k.startswith("cls.predictions.") for k in state)
            else NystromformerModel
        )
    model = cls(with_attention(config, attention))
    load_bertlike(
        model,
        state,
        base_prefix="nystromformer.",
        position_offset=HF_POSITION_OFFSET,
        zero_missing_conv=False,
        source=str(folder),
    )
    return model.eval()


# ---------------------------------------------------------------------------------------------- export
def _hf_attention_fields(config: NystromformerConfig, seq_len: int | None) -> dict[str, Any]:
    att = config.attention
    if att["name"] == "softmax":
        if seq_len is not None:
            raise ValueError("segment_means_seq_len only applies to models with Nyström attention")
        return {"num_landmarks": 64, "segment_means_seq_len": 64, "inv_coeff_init_option": False}
    if att["name"] != "nystrom":
        raise ValueError(
            f"HF Nystromformer can only run 'softmax' or 'nystrom' attention, not {att['name']!r}"
        )
    att = resolved_attention(att)
    m = att["num_landmarks"]
    needed = {"pinv": "iterative", "pinv_iterations": 6, "pinv_init": "original"}
    wrong = {k: att.get(k) for k, ok in needed.items() if att.get(k) != ok}
    if wrong:
        raise ValueError(
            f"HF's Nyström branch only runs {needed}; this model has {wrong}."
            " Rebuild it with those attention options (or softmax) before to_hf"
        )
    seq_len = config.max_position_embeddings if seq_len is None else seq_len
    if seq_len % m or seq_len == m:
        raise ValueError(
            f"segment_means_seq_len ({seq_len}) must be a multiple of num_landmarks ({m}) and larger"
        )
    return {"num_landmarks": m, "segment_means_seq_len": seq_len, "inv_coeff_init_option": False}


def to_hf(
    model: NystromformerPreTrainedModel, path: str | Path, *, segment_means_seq_len: int | None = None
) -> None:
    """Write ``model`` as a HF Nystromformer folder ``transformers`` loads (``model.safetensors``).

    Needs a post-LN model with embedding LayerNorm, a token-type table, q/k/v biases and no final norm
    (else ``ValueError``). A model without conv gets an all-zero kernel-1 conv (HF always has one; adding
    zero is exact). Nyström models need HF's pinv settings and a fixed ``segment_means_seq_len``
    (default ``max_position_embeddings``): HF is exact only at that length. Heads HF lacks (pooler, SOP,
    classifiers) are written as extra keys, ignored by HF; a ``"nystrom"`` block in ``config.json`` lets
    :func:`from_hf` restore the exact class and config.
    """
    config = model.config
    bad = {
        "norm_position": (config.norm_position, "post"),
        "embedding_norm": (config.embedding_norm, True),
        "final_norm": (config.final_norm, False),
        "qkv_bias": (config.qkv_bias, True),
    }
    wrong = {k: v for k, (v, ok) in bad.items() if v != ok}
    if wrong or config.type_vocab_size == 0:
        raise ValueError(
            f"HF Nystromformer is a post-LN BERT layout; this model cannot be exported: {wrong}"
            f"{' type_vocab_size=0' if config.type_vocab_size == 0 else ''}"
        )
    fields = _hf_attention_fields(config, segment_means_seq_len)
    lm = isinstance(model, (NystromformerForMaskedLM, NystromformerForPreTraining))
    prefix = "nystromformer." if lm else ""
    plan = _plan(model, prefix)
    state: dict[str, torch.Tensor] = {}
    for key, t in model.state_dict().items():
        names, kind = plan[key]
        t = t.detach().cpu()
        if kind == "pos":
            t = torch.cat([t.new_zeros(HF_POSITION_OFFSET, t.shape[1]), t])  # (p + 2, e)
        parts = t.chunk(3, 0) if kind == "qkv" else [t]
        state.update({n: p.contiguous() for n, p in zip(names, parts)})
    h = config.num_attention_heads
    for i in range(config.num_hidden_layers):
        conv = f"{prefix}encoder.layer.{i}.attention.self.conv.weight"
        state.setdefault(conv, torch.zeros(h, 1, 1, 1))  # (h, 1, k=1, 1)
    kernel = resolved_attention(config.attention).get("conv_kernel_size") or 1
    hf = {
        "architectures": ["NystromformerForMaskedLM" if lm else "NystromformerModel"],
        "model_type": "nystromformer",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "conv_kernel_size": kernel,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "tie_word_embeddings": True,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        **fields,
        "nystrom": {"architecture": type(model).__name__, "config": config.to_dict()},
    }
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
