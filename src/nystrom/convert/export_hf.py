"""Ours -> transformers' own Nystromformer: :func:`to_hf` writes a folder ``transformers`` loads, and
:func:`config_from_hf` reads HF's config fields into ours (``to_hf`` checks that HF's config describes
ours exactly by reading it back; :mod:`nystrom.convert.interop_hf` uses it to import).

Legend: e hidden size, h heads, k conv kernel, p positions, m landmarks.

This module imports no model class (the models' ``to_hf`` method calls it: models -> export, never back).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from nystrom.convert.interop_keys import HF_POSITION_OFFSET, _plan
from nystrom.convert.weights import CheckpointError
from nystrom.model.configuration_nystromformer import (
    ACTIVATIONS,
    NystromformerConfig,
    resolved_attention,
)

#: transformers class -> ours (same names); ours -> the transformers class to_hf writes
HF_HEADS = ("NystromformerModel", "NystromformerForMaskedLM", "NystromformerForSequenceClassification",
            "NystromformerForTokenClassification", "NystromformerForQuestionAnswering",
            "NystromformerForMultipleChoice")  # fmt: skip
_KEY_HINTS = (("cls.predictions.", "NystromformerForMaskedLM"), ("classifier.out_proj.", "NystromformerForSequenceClassification"),
              ("qa_outputs.", "NystromformerForQuestionAnswering"), ("pre_classifier.", "NystromformerForMultipleChoice"),
              ("classifier.weight", "NystromformerForTokenClassification"))  # fmt: skip
#: key prefixes each transformers class holds (the rest of a file written by to_hf is ours only)
_ENCODER = ("nystromformer.embeddings.", "nystromformer.encoder.")
HF_KEYS = {
    "NystromformerModel": ("embeddings.", "encoder."),
    "NystromformerForMaskedLM": (*_ENCODER, "cls.predictions."),
    "NystromformerForSequenceClassification": (*_ENCODER, "classifier."),
    "NystromformerForTokenClassification": (*_ENCODER, "classifier."),
    "NystromformerForQuestionAnswering": (*_ENCODER, "qa_outputs."),
    "NystromformerForMultipleChoice": (*_ENCODER, "pre_classifier.", "classifier."),
}
# written by transformers, not part of the model's definition
_HF_NOISE = ("architectures", "transformers_version", "_name_or_path", "nystrom", "dtype", "torch_dtype")


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
        attention = {"name": "nystrom", "num_landmarks": m, "pinv_iterations": 6, "pinv_init": init,
                     "conv_kernel_size": conv}  # fmt: skip
    pad = hf.get("pad_token_id", 1)
    dropout = hf.get("hidden_dropout_prob", 0.1)
    labels = {k: hf[k] for k in ("id2label", "label2id", "problem_type") if hf.get(k) is not None}
    if "num_labels" in hf and "id2label" not in hf:
        labels["num_labels"] = hf["num_labels"]
    try:
        return NystromformerConfig(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
            max_position_embeddings=hf.get("max_position_embeddings", 510), type_vocab_size=hf.get("type_vocab_size", 2),
            pad_token_id=pad if isinstance(pad, int) and 0 <= pad < hf["vocab_size"] else None,
            hidden_act=act, norm_position="post", embedding_norm=True, final_norm=False,
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)), dropout=dropout, attention=attention,
            pooler=False, pooling="cls", classifier_act=act, classifier_dropout=dropout,
            initializer_range=float(hf.get("initializer_range", 0.02)), position_offset=HF_POSITION_OFFSET,
            hf_config={k: v for k, v in hf.items() if k not in _HF_NOISE}, **labels,
        )  # fmt: skip
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{source}: {err}") from err


def _hf_attention_fields(config: NystromformerConfig, seq_len: int | None) -> dict[str, Any]:
    if config.per_layer_attention:
        raise ValueError(
            "transformers' Nystromformer runs one attention in every layer; this model has one per layer"
            f" ({[a['name'] for a in config.attention]}), which only our own folders (save_pretrained) hold"
        )
    att, kept = config.attention, config.hf_config or {}
    if att["name"] == "softmax":
        if seq_len is not None:
            raise ValueError("segment_means_seq_len only applies to models with Nyström attention")
        m = kept.get("num_landmarks", 64)
        same = kept.get("segment_means_seq_len") == m  # HF runs softmax when the two are equal
        return {"num_landmarks": m, "segment_means_seq_len": m,
                "inv_coeff_init_option": kept.get("inv_coeff_init_option", False) if same else False}  # fmt: skip
    if att["name"] != "nystrom":
        raise ValueError(
            f"transformers' Nystromformer runs only 'softmax' or 'nystrom' attention, not {att['name']!r}"
        )
    att = resolved_attention(att)
    m = att["num_landmarks"]
    needed = {"pinv": "iterative", "pinv_iterations": 6, "pinv_init": "original"}
    wrong = {k: att.get(k) for k, ok in needed.items() if att.get(k) != ok}
    if wrong:
        raise ValueError(
            f"transformers' Nyström branch only runs {needed}; this model has {wrong}."
            " Rebuild it with those attention options (or softmax) before to_hf"
        )
    if seq_len is None:
        seq_len = kept.get("segment_means_seq_len", config.max_position_embeddings)
    if seq_len % m or seq_len == m:
        raise ValueError(
            f"segment_means_seq_len ({seq_len}) must be a multiple of num_landmarks ({m}) and larger"
        )
    return {"num_landmarks": m, "segment_means_seq_len": seq_len, "inv_coeff_init_option": False}


def _hf_head(model: nn.Module) -> str:
    """The transformers class that computes ``model``'s function (its MLM part for pre-training), or
    ``"NystromformerModel"`` (the encoder) when transformers has no such head."""
    name, config = type(model).__name__, model.config
    if name == "NystromformerForPreTraining":
        return "NystromformerForMaskedLM"
    if (
        name in ("NystromformerForSequenceClassification", "NystromformerForMultipleChoice")
        and config.pooling != "cls"
    ):
        return "NystromformerModel"  # transformers pools the first token
    if name == "NystromformerForSequenceClassification" and (
        config.classifier_act != config.hidden_act or config.classifier_hidden != config.hidden_size
    ):
        return "NystromformerModel"  # transformers' classifier is Linear(e, e) -> hidden_act -> Linear(e, c)
    return name if name in HF_HEADS else "NystromformerModel"


def to_hf(model: nn.Module, path: str | Path, *, segment_means_seq_len: int | None = None) -> None:
    """Write ``model`` as a transformers Nystromformer folder (``config.json`` + ``model.safetensors``) that
    ``transformers.AutoModel*.from_pretrained`` loads with no missing or unexpected keys.

    Needs a post-LN model with embedding LayerNorm, a token-type table, q/k/v biases and no final norm,
    and softmax or HF-style Nyström attention (else ``ValueError``). A model without conv gets an all-zero
    kernel-1 conv (HF always has one; adding zero is exact). ``architectures`` names the transformers class
    computing the model's function; parts transformers has no place for (a pooler, the SOP head, a head
    with mean pooling) are still written, with a warning, so :func:`from_hf` restores the whole model.
    ``segment_means_seq_len`` is the fixed length HF's Nyström branch needs
    (default: the imported model's, else ``max_position_embeddings``). When HF's config cannot describe
    ours, it also carries ours under ``"nystrom"`` so :func:`from_hf` restores the exact class and config.
    """
    config = model.config
    bad = {"norm_position": (config.norm_position, "post"), "embedding_norm": (config.embedding_norm, True),
           "final_norm": (config.final_norm, False), "qkv_bias": (config.qkv_bias, True)}  # fmt: skip
    wrong = {k: v for k, (v, ok) in bad.items() if v != ok}
    if wrong or config.type_vocab_size == 0 or config.position_offset not in (0, HF_POSITION_OFFSET):
        raise ValueError(
            f"transformers' Nystromformer is a post-LN BERT layout; this model cannot be exported: {wrong}"
            f"{' type_vocab_size=0' if config.type_vocab_size == 0 else ''}"
        )
    arch = _hf_head(model)
    fields = _hf_attention_fields(config, segment_means_seq_len)
    prefix = "" if arch == "NystromformerModel" else "nystromformer."
    state: dict[str, torch.Tensor] = {}
    for key, (names, kind) in _plan(model, prefix).items():
        if kind == "tied":
            continue  # transformers ties the decoder to the word embeddings again
        t = model.state_dict()[key].detach().cpu()
        if key.endswith("position_embeddings.weight") and config.position_offset == 0:
            t = torch.cat([t.new_zeros(HF_POSITION_OFFSET, t.shape[1]), t])  # (p + 2, e): HF's reserved rows
        parts = t.chunk(3, 0) if kind == "qkv" else [t]
        state.update({n: p.contiguous() for n, p in zip(names, parts)})
    for i in range(config.num_hidden_layers):
        state.setdefault(
            f"{prefix}encoder.layer.{i}.attention.self.conv.weight",
            torch.zeros(config.num_attention_heads, 1, 1, 1),
        )  # fmt: skip  (h, 1, k=1, 1)
    hf = _hf_config(model, arch, fields)
    extra = sorted(k for k in state if not k.startswith(HF_KEYS[arch]))
    if extra:
        warnings.warn(
            f"to_hf: transformers' {arch} has no place for {extra[:4]}{'...' if len(extra) > 4 else ''} (it"
            f" computes the {'MLM' if 'Masked' in arch else 'encoder'} part of {type(model).__name__});"
            " nystrom.from_hf reads the whole model back",
            stacklevel=2,
        )
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _hf_config(model: nn.Module, arch: str, fields: dict[str, Any]) -> dict[str, Any]:
    config = model.config
    kernel = resolved_attention(config.attention).get("conv_kernel_size") or 1
    hf = {
        "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": True,
        "attention_probs_dropout_prob": config.dropout,
        **(config.hf_config or {}),
        "architectures": [arch], "model_type": "nystromformer",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers, "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size, "hidden_act": config.hidden_act,
        "hidden_dropout_prob": config.dropout, "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size, "conv_kernel_size": kernel,
        "initializer_range": config.initializer_range, "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id, "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        **fields,
    }  # fmt: skip
    default = {i: f"LABEL_{i}" for i in range(2)}  # transformers leaves these out of config.json
    if arch not in ("NystromformerModel", "NystromformerForMaskedLM") and (
        config.id2label != default or "id2label" in (config.hf_config or {})
    ):
        hf["id2label"] = {str(k): v for k, v in config.id2label.items()}
        hf["label2id"] = dict(config.label2id)
        if config.problem_type is not None:
            hf["problem_type"] = config.problem_type
    same = arch == type(model).__name__
    if same and _comparable(config_from_hf(hf, source="to_hf")) == _comparable(config):
        return hf  # HF's config describes ours exactly: nothing to add
    hf["nystrom"] = {"architecture": type(model).__name__, "config": config.to_dict()}
    return hf


def _comparable(config: NystromformerConfig) -> dict[str, Any]:
    d = config.to_dict()
    for key in ("hf_config", "transformers_version", "_name_or_path", "architectures", "dtype"):
        d.pop(key, None)
    return d
