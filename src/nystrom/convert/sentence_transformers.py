"""Folders of ours that sentence-transformers loads as they are: ``SentenceTransformer(folder)`` after
``import nystrom``, with ``max_seq_length`` the long length (no silent cut to the tokenizer's 512).

:func:`write_sentence_transformers` adds sentence-transformers' files to a folder holding one of our models
and its tokenizer (what ``nystrom convert long`` writes):

- ``modules.json``: ``Transformer`` (the folder itself, loaded with ``AutoModel``) -> ``Pooling`` ->
  ``Normalize`` (when the source has it);
- ``sentence_bert_config.json`` with ``max_seq_length`` (the source's other keys, e.g. ``do_lower_case``,
  kept) and ``tokenizer_config.json``'s ``model_max_length`` set to the same value;
- ``1_Pooling/config.json``: the source's own when the source is a sentence-transformers folder (its
  ``modules.json`` read), else mean pooling over the real tokens (all-MiniLM-L6-v2's);
- ``config_sentence_transformers.json``: the source's prompts and similarity function, when it has them;
- ``README.md``: how to load it.

Only json is written: sentence-transformers itself is not needed here. The module types are written with
the names every sentence-transformers release reads (``sentence_transformers.models.*``, 2.x to 6.x).

Loading needs ``import nystrom`` first: the folder's ``model_type`` (``nystrom-nystromformer``) reaches
transformers' ``AutoConfig``/``AutoModel`` only through the registration that import does, and nothing in the
folder asks for ``trust_remote_code``. Without the import, loading fails (transformers: "model type
`nystrom-nystromformer` ... does not recognize this architecture"); it never falls back to another model.

Legend: e hidden size, N the long length.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nystrom.convert.weights import CheckpointError, read_json
from nystrom.model.configuration_nystromformer import MODEL_TYPE

#: the module types written (their sentence-transformers 2.x names, which 3.x to 6.x still read)
MODULE_TYPES = {
    "Transformer": "sentence_transformers.models.Transformer",
    "Pooling": "sentence_transformers.models.Pooling",
    "Normalize": "sentence_transformers.models.Normalize",
}
#: a source's ``config_sentence_transformers.json`` keys that carry over (not its versions)
KEPT_SETTINGS = ("prompts", "default_prompt_name", "similarity_fn_name")


@dataclass(frozen=True)
class SentenceTransformersLayout:
    """What :func:`write_sentence_transformers` wrote: ``max_seq_length`` (N), the ``pooling`` config, whether a
    ``Normalize`` module follows, and the source folder the pooling came from (None: the mean default)."""

    max_seq_length: int
    pooling: dict[str, Any]
    normalize: bool
    pooling_source: str | None

    @property
    def pooling_mode(self) -> str:
        """The active pooling mode(s), e.g. ``"mean"``, from either the current or the 2.x config keys."""
        if "pooling_mode" in self.pooling:
            mode = self.pooling["pooling_mode"]
            return mode if isinstance(mode, str) else "+".join(mode)
        on = [k.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
              for k, v in self.pooling.items() if k.startswith("pooling_mode_") and v is True]  # fmt: skip
        return "+".join(on) or "mean"


def mean_pooling(hidden_size: int) -> dict[str, Any]:
    """all-MiniLM-L6-v2's ``1_Pooling/config.json``: the mean over real tokens ([CLS] and [SEP] included)."""
    return {
        "word_embedding_dimension": hidden_size, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
    }  # fmt: skip


def _source_modules(source: Path, hidden_size: int) -> tuple[dict[str, Any], bool, dict, dict]:
    """``(pooling config, normalize, sentence_bert_config, kept settings)`` of a sentence-transformers folder."""
    path = source / "modules.json"
    try:
        modules = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not a readable modules.json ({err})") from err
    if not isinstance(modules, list) or not all(isinstance(m, dict) and "type" in m for m in modules):
        raise CheckpointError(f"{path}: expected a list of modules, each with a 'type'")
    kinds = [str(m["type"]).rsplit(".", 1)[-1] for m in modules]
    if (
        kinds[:2] != ["Transformer", "Pooling"]
        or kinds[2:] not in ([], ["Normalize"])
        or modules[0].get("path")
    ):
        raise CheckpointError(
            f"{path}: modules {kinds} (Transformer at {modules[0].get('path')!r}); only a Transformer at the"
            " folder's root followed by Pooling and an optional Normalize carry over to the long model. Convert"
            " without --sentence-transformers and add the other modules yourself"
        )
    pooling = read_json(source / str(modules[1].get("path", "")) / "config.json")
    width = pooling.get("word_embedding_dimension", pooling.get("embedding_dimension"))
    if width != hidden_size:
        raise CheckpointError(
            f"{source / str(modules[1].get('path', ''))}/config.json: pooling width {width} is not the model's"
            f" hidden size {hidden_size}: is {source} the source of this folder?"
        )
    bert_config = source / "sentence_bert_config.json"
    st_config = read_json(bert_config) if bert_config.is_file() else {}
    settings_file = source / "config_sentence_transformers.json"
    settings = read_json(settings_file) if settings_file.is_file() else {}
    kept = {k: settings[k] for k in KEPT_SETTINGS if k in settings}
    return pooling, kinds[2:] == ["Normalize"], st_config, kept


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _readme(folder: Path, layout: SentenceTransformersLayout, source: Path | None) -> str:
    chain = f"Transformer -> Pooling ({layout.pooling_mode})" + (" -> Normalize" if layout.normalize else "")
    return (
        f"# {folder.name}\n\nA long-context Nyströmformer of the `nystrom` package (model_type `{MODEL_TYPE}`),"
        f" converted from {source if source else 'a short model'}: {chain}, inputs up to"
        f" {layout.max_seq_length} tokens.\n\n```python\nimport nystrom  # registers the model with transformers'"
        " Auto classes: without it loading fails\nfrom sentence_transformers import SentenceTransformer\n\n"
        f"model = SentenceTransformer('path/to/{folder.name}')\nembeddings = model.encode(documents, batch_size=4,"
        " show_progress_bar=True)\n```\n\nA document longer than `max_seq_length` is cut to its first"
        " `max_seq_length` tokens ([CLS] and [SEP] included), as sentence-transformers does for every model.\n"
    )


def write_sentence_transformers(
    folder: str | Path,
    *,
    source: str | Path | None = None,
    max_seq_length: int | None = None,
    normalize: bool | None = None,
) -> SentenceTransformersLayout:
    """Add sentence-transformers' files to ``folder`` (a model of ours with its tokenizer) so that
    ``SentenceTransformer(folder)`` loads it, after ``import nystrom``, with ``max_seq_length`` tokens.

    ``source``: the folder the model was converted from; when it is a sentence-transformers folder
    (``modules.json``), its pooling, ``Normalize``, ``sentence_bert_config.json`` keys, prompts and
    similarity function carry over; otherwise (or with no source) mean pooling. ``max_seq_length``: default
    the model's positions (``max_position_embeddings`` less the reserved ``position_offset`` rows), at most
    that. ``normalize``: add (True) or leave out (False) the ``Normalize`` module; default the source's
    choice (no ``Normalize`` without a sentence-transformers source). Also sets the tokenizer's
    ``model_max_length`` to ``max_seq_length``. Raises :class:`CheckpointError` (naming the file) for a
    folder that is not ours or has no tokenizer, and a source whose modules do not carry over.
    """
    folder = Path(folder)
    config = read_json(folder / "config.json")
    if config.get("model_type") != MODEL_TYPE:
        raise CheckpointError(
            f"{folder / 'config.json'}: model_type {config.get('model_type')!r} is not ours ({MODEL_TYPE!r});"
            " convert the model first (nystrom convert long / to-nystrom), then write its sentence-transformers files"
        )
    positions = int(config.get("max_position_embeddings", 512)) - int(config.get("position_offset", 0))
    length = positions if max_seq_length is None else max_seq_length
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= positions:
        raise ValueError(
            f"max_seq_length must be an int in [1, {positions}] (the positions of {folder / 'config.json'}),"
            f" got {max_seq_length!r}: convert to more positions for longer inputs"
        )
    tokenizer_config = folder / "tokenizer_config.json"
    if not tokenizer_config.is_file():
        raise CheckpointError(
            f"{folder} has no tokenizer (tokenizer_config.json): write one first, e.g."
            " nystrom.model.save_tokenizer('tokenizer.json', folder, model_max_length=N) or nystrom convert long"
            " --tokenizer tokenizer.json"
        )
    hidden = int(config["hidden_size"])
    pooling, source_normalize, st_config, kept = mean_pooling(hidden), False, {}, {}
    st_source = source is not None and (Path(source) / "modules.json").is_file()
    if st_source:
        pooling, source_normalize, st_config, kept = _source_modules(Path(source), hidden)
    layout = SentenceTransformersLayout(
        max_seq_length=length, pooling=pooling, normalize=source_normalize if normalize is None else normalize,
        pooling_source=str(source) if st_source else None,
    )  # fmt: skip
    modules = [{"idx": 0, "name": "0", "path": "", "type": MODULE_TYPES["Transformer"]},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": MODULE_TYPES["Pooling"]}]  # fmt: skip
    if layout.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": MODULE_TYPES["Normalize"]})
        (folder / "2_Normalize").mkdir(exist_ok=True)  # Normalize has no settings: an empty folder
    _write_json(folder / "modules.json", modules)
    _write_json(folder / "1_Pooling" / "config.json", pooling)
    _write_json(
        folder / "sentence_bert_config.json", {"do_lower_case": False, **st_config, "max_seq_length": length}
    )
    if kept:
        _write_json(folder / "config_sentence_transformers.json", kept)
    tok = read_json(tokenizer_config)
    tok["model_max_length"] = length
    _write_json(tokenizer_config, tok)
    (folder / "README.md").write_text(_readme(folder, layout, None if source is None else Path(source)))
    return layout


__all__ = ["MODULE_TYPES", "SentenceTransformersLayout", "mean_pooling", "write_sentence_transformers"]
