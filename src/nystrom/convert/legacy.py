"""Converting checkpoint folders written before the models became transformers models (our own
``"format": "nystrom"`` config.json) into transformers folders that ``AutoModel*.from_pretrained`` loads."""

from __future__ import annotations

import re
from pathlib import Path

from nystrom.convert.tokenizer import save_tokenizer
from nystrom.convert.weights import CheckpointError, copy_checked, read_json, read_weights
from nystrom.model.configuration_nystromformer import NystromformerConfig
from nystrom.model.modeling_heads import MODEL_CLASSES

#: old parameter name pattern -> new name (heads renamed when the classes became transformers models)
_RENAMES = ((r"^classifier\.out\.", "classifier.out_proj."), (r"^lm_head\.bias$", "lm_head.decoder.bias"))
#: fields added since, with the values that reproduce the old behaviour
_OLD_DEFAULTS = {"linear_init": "normal", "classifier_act": "relu", "classifier_dropout": 0.0}


def convert_legacy_checkpoint(src: str | Path, dst: str | Path) -> None:
    """Rewrite the old native folder ``src`` (``config.json`` with ``"format": "nystrom"`` +
    ``model.safetensors``, and ``tokenizer.json`` if any) as a transformers folder ``dst`` computing the same
    function: ``config.json`` (model_type ``nystrom-nystromformer``), ``model.safetensors`` and, when ``src``
    has a tokenizer.json, a tokenizer ``AutoTokenizer`` loads."""
    src, dst = Path(src), Path(dst)
    meta = read_json(src / "config.json")
    if meta.get("format") != "nystrom":
        raise CheckpointError(
            f'{src / "config.json"} is not an old nystrom checkpoint (no "format": "nystrom")'
        )
    arch = meta.get("architecture")
    if arch not in MODEL_CLASSES:
        raise CheckpointError(
            f"{src / 'config.json'}: architecture must be one of {sorted(MODEL_CLASSES)}, got {arch!r}"
        )
    old = meta.get("config")
    if not isinstance(old, dict):
        raise CheckpointError(f'{src / "config.json"}: "config" must be a JSON object')
    try:
        config = NystromformerConfig(**{**_OLD_DEFAULTS, **old})
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{src / 'config.json'} [config]: {err}") from err
    model = MODEL_CLASSES[arch](config)
    state = {}
    for key, t in read_weights(src).items():
        for pattern, new in _RENAMES:
            key = re.sub(pattern, new, key)
        state[key] = t
    own = model.state_dict()
    if "lm_head.decoder.weight" in own:  # tied to the word embeddings; old files did not store it
        state["lm_head.decoder.weight"] = state.get("nystromformer.embeddings.word_embeddings.weight")
    copy_checked(
        model, state, missing=sorted(set(own) - set(state)), unexpected=sorted(set(state) - set(own)),
        shapes=[k for k in set(own) & set(state) if state[k] is not None and state[k].shape != own[k].shape],
        source=str(src),
    )  # fmt: skip
    model.save_pretrained(dst)
    if (src / "tokenizer.json").is_file():
        save_tokenizer(src / "tokenizer.json", dst, model_max_length=config.max_position_embeddings)
