"""The one start-point option, ``--init-from``, of every command that begins from a model.

A start point is one of:

- a folder of ours (``model_type`` ``nystrom-nystromformer``; a ``nystrom pretrain``/``finetune`` run folder
  counts by its ``model/`` sub-folder): its weights, attention and tokenizer;
- a BERT-family folder (``bert``, ``roberta``, ``xlm-roberta``, ``camembert``) or ``minilm`` (the installed
  all-MiniLM-L6-v2): the paper's "from standard" start, BERT's weights with our attention;
- a transformers Nystromformer folder (``model_type`` ``nystromformer``): its weights, converted;
- a configuration: a preset name (``bert-small``, ``bert-base``, ``lra``) or a config ``.json``: a model
  drawn at random from that architecture (pre-training "from scratch").

The kind is read from the folder's ``config.json`` alone, so a wrong folder is a usage error at parse time;
nothing here imports torch or the library (the lists below are checked against the library by a test).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

#: nystrom.model.presets.PRESETS: configurations a model can be drawn from
CONFIG_PRESETS = ("lra", "bert-small", "bert-base")
#: nystrom.convert.interop_bert.BERT_FAMILY: folders converted by from_bert / from_roberta
BERT_TYPES = ("bert", "roberta", "xlm-roberta", "camembert")
OURS, HF_NYSTROMFORMER = "nystrom-nystromformer", "nystromformer"
MINILM = "minilm"
KINDS = ("nystrom", "bert", "hf", "config")
FORMS = (
    "a folder of ours, a BERT/RoBERTa/XLM-R folder, a transformers Nystromformer folder, 'minilm', a config"
    f" preset ({', '.join(CONFIG_PRESETS)}) or a config .json"
)


@dataclass(frozen=True)
class StartPoint:
    """``kind`` (one of :data:`KINDS`), ``source`` (the model folder, ``minilm``, a preset or a .json) and
    the folder's ``model_type``."""

    kind: str
    source: str
    model_type: str | None = None

    @property
    def has_weights(self) -> bool:
        return self.kind != "config"


def _model_type(config: Path) -> str | None:
    try:
        data = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{config} is not a readable JSON config ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{config} is not a JSON object")
    if data.get("format") == "nystrom":
        raise ValueError(
            f"{config.parent} is an old nystrom folder: convert it first with `nystrom convert legacy`"
        )
    return data.get("model_type")


def detect(text: str) -> StartPoint:
    """The start point ``text`` names; ``ValueError`` (naming the valid forms) when it names none."""
    if text == MINILM:
        return StartPoint("bert", MINILM, "bert")
    if text in CONFIG_PRESETS:
        return StartPoint("config", text)
    path = Path(text)
    if path.suffix == ".json":
        if not path.is_file():
            raise ValueError(f"{text!r} does not exist")
        return StartPoint("config", text)
    if not path.is_dir():
        raise ValueError(f"{text!r} is neither an existing folder nor a preset; expected {FORMS}")
    folder = path if (path / "config.json").is_file() else path / "model"  # a run folder holds model/
    if not (folder / "config.json").is_file():
        raise ValueError(f"{text!r} holds no config.json (nor model/config.json); expected {FORMS}")
    model_type = _model_type(folder / "config.json")
    kind = {OURS: "nystrom", HF_NYSTROMFORMER: "hf", **dict.fromkeys(BERT_TYPES, "bert")}.get(model_type)
    if kind is None:
        raise ValueError(
            f"{folder / 'config.json'}: model_type {model_type!r} is not one --init-from starts from"
            f" ({', '.join((OURS, HF_NYSTROMFORMER, *BERT_TYPES))})"
        )
    return StartPoint(kind, str(folder), model_type)


def init_from(text: str) -> str:
    """argparse ``type=`` of ``--init-from``: checked (and its kind detected) at parse time, kept as written."""
    try:
        detect(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    return text


def add_init_from(p: argparse.ArgumentParser, *, default: str | None, what: str) -> None:
    """``--init-from`` with this command's default and what it does with the start point."""
    p.add_argument(
        "--init-from", type=init_from, default=default, metavar="START",
        help=f"{what}: {FORMS}" + (f" (default {default})" if default else ""),
    )  # fmt: skip
