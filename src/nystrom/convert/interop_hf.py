"""transformers' own Nystromformer (model_type ``"nystromformer"``, the uw-madison layout) <-> our models.

Legend: e hidden size, h heads, k conv kernel, p positions, m landmarks.

HF layout: ``[nystromformer.]embeddings.{word,position,token_type}_embeddings`` with a position table of
p + 2 rows (ids start at 2; we keep the rows, ``config.position_offset = 2``),
``encoder.layer.{i}.attention.self.{query,key,value}`` (our joint ``qkv`` = their rows concatenated in that
order), ``attention.self.conv.weight`` (h, 1, k, 1), post-LN BERT blocks, and per head class the MLM head
``cls.predictions.*`` (decoder tied to the word embeddings), ``classifier.dense/out_proj`` (sequence),
``classifier`` (token), ``qa_outputs`` (QA), ``pre_classifier`` + ``classifier`` (multiple choice). The
key rules live in :mod:`nystrom.convert.interop_keys`. HF → ours → HF is lossless: our config keeps HF's own
fields (``hf_config``) and ``to_hf`` writes them back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nystrom.convert.export_hf import _KEY_HINTS, HF_HEADS, config_from_hf, to_hf  # noqa: F401 (to_hf re-exported)
from nystrom.convert.interop_keys import HF_POSITION_OFFSET, check_source_config, load_bertlike
from nystrom.convert.weights import CheckpointError, read_json, read_weights
from nystrom.model.configuration_nystromformer import (
    NystromformerConfig,
    attention_option_names,
    normalize_attention,
    resolved_attention,
)
from nystrom.model.modeling_heads import MODEL_CLASSES
from nystrom.model.modeling_nystromformer import NystromformerPreTrainedModel


# ---------------------------------------------------------------------------------------------- import
def with_attention(
    config: NystromformerConfig, attention: str | dict[str, Any] | list[str | dict[str, Any]] | None
) -> NystromformerConfig:
    """``config`` with ``attention`` swapped in (one spec, or a list of one per layer); a conv kernel the user
    did not set keeps the checkpoint's layer by layer."""
    if attention is None:
        return config
    spec = normalize_attention(attention)
    for i, one in enumerate(spec if isinstance(spec, list) else [spec]):
        old = resolved_attention(config.layer_attention(i)).get("conv_kernel_size")
        if "conv_kernel_size" not in one and old is not None:
            if "conv_kernel_size" in attention_option_names(one["name"]):
                one["conv_kernel_size"] = old  # the checkpoint carries these conv weights
    return config.replace(attention=spec)


def _hf_class(hf: dict, state: dict[str, torch.Tensor], source: str) -> str:
    arch = (hf.get("architectures") or [None])[0]
    if arch is None:  # no architectures entry: the head its weights hold
        arch = next(
            (cls for key, cls in _KEY_HINTS if any(k.startswith(key) for k in state)), "NystromformerModel"
        )
    if arch not in HF_HEADS:
        raise CheckpointError(f"{source}: architecture {arch!r} is not one of transformers' {list(HF_HEADS)}")
    return arch


def from_hf(
    path: str | Path, *, attention: str | dict[str, Any] | None = None
) -> NystromformerPreTrainedModel:
    """Load a transformers Nystromformer folder (``config.json`` + safetensors/bin weights, sharded or not)
    as the matching class of ours (``architectures[0]``: the base model or any head), in eval mode.

    By default the attention reproduces HF: exact softmax + conv when ``num_landmarks ==
    segment_means_seq_len`` (all published checkpoints), else HF's Nyström settings. ``attention``
    (``"nystrom"`` or ``{"name": "nystrom", "num_landmarks": 64, ...}``) switches variant; an unset
    ``conv_kernel_size`` keeps the checkpoint's kernel. Folders written by :func:`to_hf` come back as the
    class and config that wrote them.
    """
    folder = Path(path)
    source = str(folder / "config.json")
    hf = read_json(folder / "config.json")
    if hf.get("model_type") not in (None, "nystromformer"):
        hint = " (use nystrom.from_bert for BERT folders)" if hf.get("model_type") == "bert" else ""
        raise CheckpointError(
            f"{source}: model_type is {hf.get('model_type')!r}, expected 'nystromformer'{hint}"
        )
    state = read_weights(folder)
    check_source_config(hf, state, prefix="nystromformer.", position_offset=HF_POSITION_OFFSET, source=source)
    ours = hf.get("nystrom")
    if isinstance(ours, dict):  # written by to_hf from a model HF cannot describe fully
        try:
            config = NystromformerConfig.from_dict(ours.get("config"))
        except (ValueError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{source} [nystrom.config]: {err}") from err
        arch = ours.get("architecture")
        if arch not in MODEL_CLASSES:
            raise CheckpointError(f"{source}: unknown nystrom.architecture {arch!r}")
    else:
        config = config_from_hf(hf, source=source)
        arch = _hf_class(hf, state, source)
    if config.position_offset == 0:  # a model of ours that to_hf wrote: drop the 2 rows HF reserves
        for key in [k for k in state if k.endswith("embeddings.position_embeddings.weight")]:
            state[key] = state[key][HF_POSITION_OFFSET:]
    model = MODEL_CLASSES[arch](with_attention(config, attention))
    load_bertlike(model, state, base_prefix="nystromformer.", zero_missing_conv=False, source=str(folder))
    return model.eval()
