"""Model sources shared by ``nystrom pretrain`` and ``nystrom finetune``: attention specs, BERT / HF /
pre-training-run initialisation, moving an encoder (and matching heads) into a new head class, and the
transformers folder (model + tokenizer) each run writes.

Legend: e hidden size, v vocabulary, c classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nystrom.model import (
    NystromformerConfig,
    NystromformerPreTrainedModel,
    from_bert,
    from_hf,
    minilm_path,
    save_tokenizer,
)
from nystrom.model.transfer import load_folder, transfer
from nystrom_lab.text.presets import PAPER_CONV_KERNEL, parse_attention  # noqa: F401 (re-exported)


def load_config(model: str) -> NystromformerConfig:
    """``--model``: a preset name (``bert-small``, ``bert-base``, ``lra``) or a config.json path."""
    if Path(model).suffix == ".json":
        if not Path(model).is_file():
            raise FileNotFoundError(f"--model {model}: no such config file")
        return NystromformerConfig.from_json_file(model)
    return NystromformerConfig.preset(model)


def save_model_folder(model: NystromformerPreTrainedModel, tokenizer: Path, folder: Path) -> None:
    """``model.save_pretrained(folder)`` plus its tokenizer, so AutoModel*/AutoTokenizer/pipeline load it."""
    model.save_pretrained(folder)
    save_tokenizer(tokenizer, folder, model_max_length=model.config.max_position_embeddings)


def bert_folder(value: str) -> Path:
    """``--init-from-bert`` value: ``minilm`` = the bundled all-MiniLM-L6-v2, else a BERT folder."""
    return minilm_path() if value == "minilm" else Path(value)


def load_source(
    *,
    init_from_bert: str | None = None,
    from_hf_path: str | None = None,
    from_pretrain: str | None = None,
    attention: dict[str, Any] | None = None,
) -> tuple[NystromformerPreTrainedModel, Path | None]:
    """The one initialisation requested (at most one of the three), and the tokenizer.json beside it
    (None when the folder has none). ``attention`` None keeps the source's attention (BERT: Nyström-64)."""
    given = [n for n, v in (("--init-from-bert", init_from_bert), ("--from-hf", from_hf_path),
                            ("--from-pretrain", from_pretrain)) if v]  # fmt: skip
    if len(given) > 1:
        raise ValueError(f"give at most one of {given}")
    if init_from_bert:
        folder = bert_folder(init_from_bert)
        model = from_bert(folder, attention=attention)
    elif from_hf_path:
        folder = Path(from_hf_path)
        model = from_hf(folder, attention=attention)
    elif from_pretrain:
        # a model folder of ours (`nystrom convert long` output), or a `nystrom pretrain` run holding model/
        folder = Path(from_pretrain)
        if not (folder / "config.json").is_file():
            folder = folder / "model"
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"--init-from {from_pretrain}: no config.json there or in model/; expected a model folder of ours"
                " (e.g. from `nystrom convert long`) or the output folder of a"
                " finished `nystrom pretrain` run"
            )
        model = load_folder(folder)
        if attention is not None and attention != model.config.attention:
            model = transfer(model, type(model), model.config.replace(attention=attention))
    else:
        raise ValueError("no initialisation given")
    tok = folder / "tokenizer.json"
    return model, tok if tok.is_file() else None
