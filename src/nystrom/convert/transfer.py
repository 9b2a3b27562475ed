"""Loading a folder of ours as the class that wrote it, and moving an encoder (and the heads both sides
have) into another head class or attention variant."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from nystrom.convert.weights import CheckpointError
from nystrom.model.configuration_nystromformer import NystromformerConfig
from nystrom.model.modeling_heads import MODEL_CLASSES
from nystrom.model.modeling_nystromformer import NystromformerPreTrainedModel


def load_folder(folder: str | Path) -> NystromformerPreTrainedModel:
    """A folder written by ``save_pretrained`` as the class that wrote it (``config.architectures``)."""
    config = NystromformerConfig.from_pretrained(folder)
    arch = (config.architectures or ["NystromformerModel"])[0]
    if arch not in MODEL_CLASSES:
        raise CheckpointError(
            f"{folder}/config.json: architecture {arch!r} is not one of {sorted(MODEL_CLASSES)}"
        )
    return MODEL_CLASSES[arch].from_pretrained(folder, config=config)


def _optional_key(key: str) -> bool:
    """Keys a target may lack in the source: a pooler (BERT without one) or a conv skip (BERT has none)."""
    return key.startswith("pooler.") or key.endswith(".conv.weight")


def transfer(
    source: NystromformerPreTrainedModel, cls: type[NystromformerPreTrainedModel], config: NystromformerConfig
) -> NystromformerPreTrainedModel:
    """A new ``cls(config)`` holding ``source``'s encoder (and its MLM/SOP heads where both have them).

    A pooler missing from the source keeps its fresh initialisation; a conv skip missing from the source
    starts at zero (so the function is still the source's). Any other mismatch is an error.
    """
    target = cls(config)
    state = source.base_model.state_dict()
    missing, unexpected = target.base_model.load_state_dict(state, strict=False)
    bad = [k for k in missing if not _optional_key(k)] + [k for k in unexpected if not _optional_key(k)]
    if bad:
        raise ValueError(
            f"cannot move the {type(source).__name__} encoder into {cls.__name__}: keys {bad[:8]}"
        )
    if any(k.endswith(".conv.weight") for k in unexpected):
        print("[nystrom] note: the source's conv skip is dropped (the requested attention has none)")
    with torch.no_grad():
        for key in missing:
            if key.endswith(".conv.weight"):
                target.base_model.get_parameter(key).zero_()
    for head in ("lm_head", "sop_head"):
        src, dst = getattr(source, head, None), getattr(target, head, None)
        if isinstance(src, nn.Module) and isinstance(dst, nn.Module):
            dst.load_state_dict(src.state_dict())
    return target
