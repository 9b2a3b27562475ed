"""``nystrom predict MODEL_DIR``: label names and scores for new text with a fine-tuned classifier.

Legend: N examples, b batch, n tokens, c classes.

The model folder is what ``nystrom finetune`` writes to ``OUT/model``: a transformers folder (config with
``id2label`` and ``problem_type``, the weights of the best dev step, the tokenizer with the fine-tuning
length as ``model_max_length``) that ``from_pretrained`` and ``pipeline("text-classification")`` load too.
Inputs are a CSV/TSV/JSONL table (``--text-column``, ``--text-pair-column``) or plain text, one example
per line (any other suffix, or ``-`` for standard input). Outputs are JSON Lines in input order:
``{"label": name, "score": p, "scores": {name: p}}`` (softmax), ``{"labels": [names], "scores": ...}``
(multi-label: sigmoid > 0.5) or ``{"score": value}`` (regression).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from nystrom_lab.data.glue import ClassificationDataset, Examples, collate_classification
from nystrom_lab.data.tables import FORMATS, LabelSpec, read_table
from nystrom_lab.data.text import TextTokenizer, load_tokenizer
from nystrom_lab.training.device import autocast, check_precision, resolve_device, to_device


def save_classifier(model: nn.Module, tok: TextTokenizer, labels: LabelSpec, *, max_length: int, folder: Path) -> None:
    """Write a complete transformers folder: config (with ``id2label``/``label2id``/``problem_type``),
    weights, and the tokenizer (``model_max_length`` = the fine-tuning length, so pipelines truncate alike)."""
    from nystrom.convert.tokenizer import save_tokenizer

    model.save_pretrained(folder)
    save_tokenizer(tok.path, folder, model_max_length=max_length)


@dataclass
class Classifier:
    model: nn.Module
    tokenizer: TextTokenizer
    labels: LabelSpec
    max_length: int


def load_classifier(folder: str | Path) -> Classifier:
    """A sequence-classification folder: ``nystrom finetune``'s ``OUT/model``, or any folder of
    :class:`~nystrom.model.NystromformerForSequenceClassification` with a ``tokenizer.json``."""
    from nystrom.model import NystromformerForSequenceClassification

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        hint = f"; did you mean {folder / 'model'}?" if (folder / "model" / "config.json").is_file() else ""
        raise FileNotFoundError(f"{folder} is not a model folder (no config.json){hint}")
    model = NystromformerForSequenceClassification.from_pretrained(folder)
    cfg = model.config
    problem = cfg.problem_type or ("regression" if cfg.num_labels == 1 else "single_label_classification")
    names = () if problem == "regression" else tuple(cfg.id2label[i] for i in range(cfg.num_labels))
    tok_cfg = folder / "tokenizer_config.json"
    max_length = json.loads(tok_cfg.read_text()).get("model_max_length") if tok_cfg.is_file() else None
    if not isinstance(max_length, int) or max_length > cfg.max_position_embeddings:
        max_length = cfg.max_position_embeddings
    return Classifier(model, load_tokenizer(folder), LabelSpec(problem, names), max_length)


@torch.no_grad()
def predict_logits(
    model: nn.Module,
    data: ClassificationDataset,
    *,
    pad_id: int,
    batch_size: int,
    precision: str = "fp32",
    progress: bool = False,
) -> torch.Tensor:
    """Logits (N, c) float32 on the CPU, in ``data``'s order; batches hold examples of similar length."""
    device = next(model.parameters()).device
    order = sorted(range(len(data)), key=lambda i: len(data.items[i][0]))
    out: list[torch.Tensor | None] = [None] * len(data)
    was = model.training
    model.eval()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(data), unit="ex", desc="predict", dynamic_ncols=True)
    with autocast(device, precision):
        for lo in range(0, len(order), batch_size):
            idx = order[lo : lo + batch_size]
            batch = collate_classification([data[i] for i in idx], pad_id=pad_id)
            batch.pop("labels", None)
            logits = model(**to_device(batch, device)).logits.float().cpu()  # (b, c)
            for i, row in zip(idx, logits):
                out[i] = row
            if bar is not None:
                bar.update(len(idx))
    if bar is not None:
        bar.close()
    model.train(was)
    return torch.stack(out) if out else torch.zeros(0, 1)  # type: ignore[arg-type]


def decode(logits: torch.Tensor, labels: LabelSpec) -> list[dict]:
    """One JSON-able record per row of ``logits`` (N, c): names and scores."""
    if labels.problem_type == "regression":
        return [{"score": float(v)} for v in logits[:, 0]]
    multi = labels.problem_type == "multi_label_classification"
    probs = torch.sigmoid(logits) if multi else torch.softmax(logits, -1)
    records = []
    for row in probs.tolist():
        scores = dict(zip(labels.names, row))
        if multi:
            records.append({"labels": [n for n, p in scores.items() if p > 0.5], "scores": scores})
        else:
            best = max(range(len(row)), key=row.__getitem__)
            records.append({"label": labels.names[best], "score": row[best], "scores": scores})
    return records


def prediction_text(record: dict) -> str:
    """The prediction of one :func:`decode` record as a TSV cell: a name, comma-joined names or a number."""
    if "label" in record:
        return record["label"]
    return ",".join(record["labels"]) if "labels" in record else repr(record["score"])


def read_inputs(
    source: str, *, text_column: str, text_pair_column: str | None
) -> tuple[list[str], list[str] | None]:
    """Texts (and pair texts) of a table, a plain text file (one per line) or ``-`` (standard input)."""
    if source != "-" and Path(source).suffix.lower() in FORMATS:
        table = read_table(source)
        pair = table.texts(text_pair_column) if text_pair_column else None
        return table.texts(text_column), pair
    if text_pair_column:
        raise ValueError("--text-pair-column needs a CSV, TSV or JSONL input")
    if source == "-":
        text = sys.stdin.read()
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{source}: file not found")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{source}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    return [ln for ln in text.splitlines() if ln.strip()], None


def run_predict(
    model_dir: str | Path,
    source: str,
    *,
    output: str | Path | None = None,
    text_column: str = "text",
    text_pair_column: str | None = None,
    batch_size: int = 32,
    device: str = "auto",
    precision: str = "fp32",
    progress: bool = True,
) -> list[dict]:
    """Predict every input of ``source``; write JSON Lines to ``output`` (None: standard output)."""
    dev = resolve_device(device)
    check_precision(precision, dev)
    clf = load_classifier(model_dir)
    texts, pairs = read_inputs(source, text_column=text_column, text_pair_column=text_pair_column)
    records = predict_texts(
        clf, texts, pairs, batch_size=batch_size, device=dev, precision=precision, progress=progress
    )
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if output is None:
        sys.stdout.write(lines)
    else:
        Path(output).write_text(lines, encoding="utf-8")
    return records


def predict_texts(
    clf: Classifier,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    batch_size: int = 32,
    device: torch.device | None = None,
    precision: str = "fp32",
    progress: bool = False,
) -> list[dict]:
    """:func:`decode` records for ``texts`` (and their ``pairs``) with a loaded :class:`Classifier`."""
    examples = Examples(
        "predict",
        [str(i) for i in range(len(texts))],
        list(texts),
        None if pairs is None else list(pairs),
        None,
        clf.labels.names,
    )
    data = ClassificationDataset(examples, clf.tokenizer, max_length=clf.max_length)
    model = clf.model.to(device or torch.device("cpu"))
    logits = predict_logits(
        model,
        data,
        pad_id=clf.tokenizer.pad_id,
        batch_size=batch_size,
        precision=precision,
        progress=progress,
    )
    return decode(logits, clf.labels)
