"""The BERT-layout key mapping shared by HF Nystromformer and BERT checkpoint folders.

Legend: e hidden size, h heads, d head dim, p position rows.

Our keys map to HF's by regular-expression rules (``BASE_RULES`` for the encoder, ``HEAD_RULES`` for
the heads); kind ``"qkv"`` joins HF's separate query/key/value into our joint ``qkv`` (rows in that
order), ``"tied"`` is the MLM decoder tied to the word embeddings, ``"conv"`` is the attention's depthwise conv (absent from BERT). Used by :mod:`nystrom.convert.interop_hf`
(both directions) and :mod:`nystrom.convert.interop_bert` (import). :func:`check_source_config` checks a
source ``config.json`` against its tensors before any model is allocated.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from nystrom.convert.weights import CheckpointError, _names, copy_checked

HF_POSITION_OFFSET = 2  # transformers' Nystromformer starts position ids at 2
_L = r"encoder\.layers\.(\d+)\."
_H = r"encoder.layer.\1."
# (our key relative to the encoder, source key template, kind); kind "qkv" expands to query/key/value
BASE_RULES: list[tuple[str, str, str]] = [
    (r"embeddings\.word_embeddings\.weight", "embeddings.word_embeddings.weight", "copy"),
    (r"embeddings\.position_embeddings\.weight", "embeddings.position_embeddings.weight", "copy"),
    (r"embeddings\.token_type_embeddings\.weight", "embeddings.token_type_embeddings.weight", "copy"),
    (r"embeddings\.norm\.(weight|bias)", r"embeddings.LayerNorm.\1", "copy"),
    (_L + r"attention\.qkv\.(weight|bias)", _H + r"attention.self.{}.\2", "qkv"),
    (_L + r"attention\.conv\.weight", _H + "attention.self.conv.weight", "conv"),
    (_L + r"attention\.out\.(weight|bias)", _H + r"attention.output.dense.\2", "copy"),
    (_L + r"attention_norm\.(weight|bias)", _H + r"attention.output.LayerNorm.\2", "copy"),
    (_L + r"ffn\.dense_in\.(weight|bias)", _H + r"intermediate.dense.\2", "copy"),
    (_L + r"ffn\.dense_out\.(weight|bias)", _H + r"output.dense.\2", "copy"),
    (_L + r"ffn_norm\.(weight|bias)", _H + r"output.LayerNorm.\2", "copy"),
    (r"pooler\.(weight|bias)", r"pooler.dense.\1", "copy"),
]
HEAD_RULES: list[tuple[str, str, str]] = [
    (r"lm_head\.dense\.(weight|bias)", r"cls.predictions.transform.dense.\1", "copy"),
    (r"lm_head\.norm\.(weight|bias)", r"cls.predictions.transform.LayerNorm.\1", "copy"),
    (r"lm_head\.decoder\.bias", "cls.predictions.bias", "copy"),
    (r"lm_head\.decoder\.weight", "cls.predictions.decoder.weight", "tied"),  # = the word embeddings
    (r"sop_head\.(weight|bias)", r"cls.seq_relationship.\1", "copy"),
    (r"(classifier|pre_classifier|qa_outputs)\.(.+)", r"\1.\2", "copy"),
]
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def encoder_prefix(model: nn.Module) -> str:
    """``""`` for the bare encoder, ``"nystromformer."`` for a head class (transformers' ``base_model``;
    a duck-typed check, so that this module need not import the model classes that import it)."""
    return "" if model.base_model is model else model.base_model_prefix + "."


def _plan(model: nn.Module, src_prefix: str) -> dict[str, tuple[list[str], str]]:
    """our key -> (source keys, kind) for every tensor of ``model``; raises for parts HF cannot hold."""
    base = encoder_prefix(model)
    plan, unmappable = {}, []
    for key in model.state_dict():
        is_base = key.startswith(base)
        rel, rules, prefix = (key[len(base) :], BASE_RULES, src_prefix) if is_base else (key, HEAD_RULES, "")
        for pattern, template, kind in rules:
            match = re.fullmatch(pattern, rel)
            if match:
                name = match.expand(template)
                names = [name.format(p) for p in ("query", "key", "value")] if kind == "qkv" else [name]
                plan[key] = ([prefix + n for n in names], kind)
                break
        else:
            unmappable.append(key)
    if unmappable:
        raise CheckpointError(
            f"{type(model).__name__} has parameters with no BERT/HF-Nystromformer counterpart: {_names(unmappable)}"
            " (pre-LN final norm or attention-variant parameters cannot be exchanged with this layout)"
        )
    return plan


def _detect_prefix(state: dict[str, torch.Tensor], prefix: str) -> str:
    return prefix if any(k.startswith(prefix) for k in state) else ""


def load_bertlike(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    *,
    base_prefix: str,
    zero_missing_conv: bool,
    source: str,
) -> None:
    """Fill ``model`` from a BERT-like ``state`` (HF names); one error lists every missing/unexpected key and
    every shape mismatch. ``zero_missing_conv``: a conv the source lacks starts at zero (BERT + conv)."""
    prefix = _detect_prefix(state, base_prefix)
    own = model.state_dict()
    out, used, missing, shapes = {}, set(), [], []
    for key, (names, kind) in _plan(model, prefix).items():
        if kind == "tied":
            continue  # filled below from the word embeddings it is tied to
        if (
            key.endswith("lm_head.decoder.bias")
            and names[0] not in state
            and "cls.predictions.decoder.bias" in state
        ):
            names = ["cls.predictions.decoder.bias"]  # older checkpoints store the bias only on the decoder
        absent = [n for n in names if n not in state]
        if absent:
            if kind == "conv" and zero_missing_conv:
                out[key] = torch.zeros_like(own[key])
                continue
            missing.extend(absent)
            continue
        used.update(names)
        tensors = [state[n] for n in names]
        t = torch.cat(tensors, 0) if kind == "qkv" else tensors[0]  # qkv: (3·h·d, e)
        if t.shape != own[key].shape:
            shapes.append(
                f"{'+'.join(names)} -> {key}: checkpoint {tuple(t.shape)} vs model {tuple(own[key].shape)}"
            )
        out[key] = t
    for key, (_, kind) in _plan(model, prefix).items():
        word = (encoder_prefix(model)) + "embeddings.word_embeddings.weight"
        if kind == "tied" and word in out:
            out[key] = out[word]
    unexpected = []
    for name in sorted(set(state) - used):
        if name.endswith(_BUFFERS) or name == "cls.predictions.decoder.bias":
            continue
        if name == "cls.predictions.decoder.weight":
            word = state.get(prefix + "embeddings.word_embeddings.weight")
            if word is not None and word.shape == state[name].shape and torch.equal(word, state[name]):
                continue  # tied to the word embeddings, as the model computes it
        if name.endswith("attention.self.conv.weight") and not bool(state[name].any()):
            continue  # an all-zero conv adds nothing: dropping it is exact (to_hf writes one for no-conv models)
        unexpected.append(name)
    copy_checked(model, out, missing=missing, unexpected=unexpected, shapes=shapes, source=source)


_INT_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "max_position_embeddings", "type_vocab_size")  # fmt: skip


def check_source_config(
    cfg: dict, state: dict[str, torch.Tensor], *, prefix: str, position_offset: int, source: str
) -> None:
    """Types of a BERT/HF Nystromformer ``config.json`` and its sizes against the tensors, before building a
    model of that size (a config asking for 10¹² positions is refused, not allocated). Raises
    :class:`CheckpointError` naming each problem."""
    problems = []
    for key in _INT_KEYS:
        val = cfg.get(key)
        if key in cfg and (not isinstance(val, int) or isinstance(val, bool) or val < 0):
            problems.append(f"{key} must be a non-negative int, got {val!r}")
    for key in ("layer_norm_eps", "initializer_range", "hidden_dropout_prob"):
        val = cfg.get(key)
        if key in cfg and (not isinstance(val, (int, float)) or isinstance(val, bool)):
            problems.append(f"{key} must be a number, got {val!r}")
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))
    p = prefix if any(k.startswith(prefix) for k in state) else ""
    want = {  # tensor -> (dim, config key, expected size)
        "embeddings.word_embeddings.weight": [(0, "vocab_size", 0), (1, "hidden_size", 0)],
        "embeddings.position_embeddings.weight": [(0, "max_position_embeddings", position_offset)],
        "embeddings.token_type_embeddings.weight": [(0, "type_vocab_size", 0)],
        "encoder.layer.0.intermediate.dense.weight": [(0, "intermediate_size", 0)],
    }
    for name, checks in want.items():
        t = state.get(p + name)
        if t is None and any(cfg.get(key) for _, key, _ in checks):
            problems.append(f"no tensor {p + name} for {', '.join(key for _, key, _ in checks)}")
        for dim, key, extra in checks:
            if t is not None and key in cfg and (t.dim() <= dim or t.shape[dim] != cfg[key] + extra):
                problems.append(
                    f"{key}={cfg[key]} but {p + name} has shape {tuple(t.shape)}"
                    + (f" (expected {cfg[key] + extra} rows: {extra} reserved + {key})" if extra else "")
                )
    layers = {int(m.group(1)) for k in state if (m := re.match(re.escape(p) + r"encoder\.layer\.(\d+)\.", k))}
    if "num_hidden_layers" in cfg and layers != set(range(cfg["num_hidden_layers"])):
        problems.append(
            f"num_hidden_layers={cfg['num_hidden_layers']} but the weights hold layers {sorted(layers)[:8]}"
        )
    if problems:
        raise CheckpointError(f"{source} does not match its weights: " + "; ".join(problems))
