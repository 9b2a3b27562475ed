"""Model sources shared by ``nystrom pretrain``, ``finetune`` and ``convert``: the ``--init-from`` start point
loaded with the ``--attention`` spec applied, moving an encoder (and matching heads) into a new head class,
and the transformers folder (model + tokenizer) each run writes.

Legend: e hidden size, v vocabulary, c classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nystrom.convert.transfer import load_folder, transfer
from nystrom.model import (
    NystromformerConfig,
    NystromformerPreTrainedModel,
    from_bert,
    from_hf,
    from_roberta,
    minilm_path,
    save_tokenizer,
)
from nystrom_lab import attention_spec
from nystrom_lab.start_point import MINILM, detect
from nystrom_lab.text.presets import TEXT_ATTENTION_PRESET


def load_config(path: str) -> NystromformerConfig:
    """A preset name (``bert-small``, ``bert-base``, ``lra``) or a config.json path."""
    if Path(path).suffix == ".json":
        return NystromformerConfig.from_json_file(path)
    return NystromformerConfig.preset(path)


def save_model_folder(model: NystromformerPreTrainedModel, tokenizer: Path, folder: Path) -> None:
    """``model.save_pretrained(folder)`` plus its tokenizer, so AutoModel*/AutoTokenizer/pipeline load it."""
    model.save_pretrained(folder)
    save_tokenizer(tokenizer, folder, model_max_length=model.config.max_position_embeddings)


def text_attention(spec: str | None, *, max_length: int | None = None) -> dict[str, Any] | None:
    """The attention dict of ``--attention spec`` in a text command: the paper's BERT-size conv kernel for
    a Nyström spec that sets none, Linformer's length; None for None (the start point's own)."""
    if spec is None:
        return None
    return attention_spec.resolve(spec, preset=TEXT_ATTENTION_PRESET, max_length=max_length)


@dataclass(frozen=True)
class Start:
    """A loaded start point: ``model`` (None for a configuration: the caller draws it in the head class it
    trains), its ``config`` (the attention applied) and the tokenizer.json beside it (None: none there)."""

    kind: str
    model: NystromformerPreTrainedModel | None
    config: NystromformerConfig
    tokenizer: Path | None
    preset: bool = False  # a configuration named by preset (not a .json): it may take the tokenizer's v


def load_start(init_from: str, *, attention: str | None = None, max_length: int | None = None) -> Start:
    """The ``--init-from`` start point with ``--attention`` applied (None keeps the start's own; a BERT
    folder, which has none of ours, gets a Nyström spec with the text preset)."""
    point = detect(init_from)
    if attention is None and point.kind == "bert":
        attention = "nystrom"
    spec = text_attention(attention, max_length=max_length)
    if point.kind == "config":
        cfg = load_config(point.source)
        cfg = cfg if spec is None else cfg.replace(attention=spec)
        return Start("config", None, cfg, None, preset=Path(point.source).suffix != ".json")
    folder = minilm_path() if point.source == MINILM else Path(point.source)
    if point.kind == "bert":
        model = (from_bert if point.model_type == "bert" else from_roberta)(folder, attention=spec)
    elif point.kind == "hf":
        model = from_hf(folder, attention=spec)
    else:
        model = load_folder(folder)
        if spec is not None and spec != model.config.attention:
            model = transfer(model, type(model), model.config.replace(attention=spec))
    tok = folder / "tokenizer.json"
    return Start(point.kind, model, model.config, tok if tok.is_file() else None)
