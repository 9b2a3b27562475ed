"""The BERT-layout key mapping shared by HF Nystromformer and BERT checkpoint folders.

Legend: e hidden size, h heads, d head dim, p position rows.

Our keys map to HF's by regular-expression rules (``BASE_RULES`` for the encoder, ``HEAD_RULES`` for
the heads); kind ``"qkv"`` joins HF's separate query/key/value into our fused ``qkv`` (rows in that
order), ``"pos"`` drops the rows HF Nystromformer reserves before position ``HF_POSITION_OFFSET``,
``"conv"`` is the attention's depthwise conv (absent from BERT). Used by :mod:`nystrom.model.interop_hf`
(both directions) and :mod:`nystrom.model.interop_bert` (import).
"""

from __future__ import annotations

import re

import torch

from nystrom.model.checkpoint import CheckpointError, _names, copy_checked
from nystrom.model.encoder import NystromformerModel, NystromformerPreTrainedModel

HF_POSITION_OFFSET = 2
_L = r"encoder\.layers\.(\d+)\."
_H = r"encoder.layer.\1."
# (our key relative to the encoder, source key template, kind); kind "qkv" expands to query/key/value
BASE_RULES: list[tuple[str, str, str]] = [
    (r"embeddings\.word_embeddings\.weight", "embeddings.word_embeddings.weight", "copy"),
    (r"embeddings\.position_embeddings\.weight", "embeddings.position_embeddings.weight", "pos"),
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
    (r"lm_head\.bias", "cls.predictions.bias", "copy"),
    (r"sop_head\.(weight|bias)", r"cls.seq_relationship.\1", "copy"),
    (r"classifier\.(.+)", r"classifier.\1", "copy"),
]
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def _plan(model: NystromformerPreTrainedModel, src_prefix: str) -> dict[str, tuple[list[str], str]]:
    """our key -> (source keys, kind) for every tensor of ``model``; raises for parts HF cannot hold."""
    base = "" if isinstance(model, NystromformerModel) else "nystromformer."
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
    model: NystromformerPreTrainedModel,
    state: dict[str, torch.Tensor],
    *,
    base_prefix: str,
    position_offset: int,
    zero_missing_conv: bool,
    source: str,
) -> None:
    """Fill ``model`` from a BERT-like ``state`` (HF names); one error lists every missing/unexpected key and
    every shape mismatch. ``zero_missing_conv``: a conv the source lacks starts at zero (BERT + conv)."""
    prefix = _detect_prefix(state, base_prefix)
    own = model.state_dict()
    out, used, missing, shapes = {}, set(), [], []
    for key, (names, kind) in _plan(model, prefix).items():
        if key.endswith("lm_head.bias") and names[0] not in state and "cls.predictions.decoder.bias" in state:
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
        if kind == "pos":
            t = t[position_offset:]  # (p, e): drop the rows HF reserves before position 2
        if t.shape != own[key].shape:
            shapes.append(
                f"{'+'.join(names)} -> {key}: checkpoint {tuple(t.shape)} vs model {tuple(own[key].shape)}"
            )
        out[key] = t
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
