"""GLUE (SST-2, MRPC, QNLI, QQP, MNLI) TSV files and IMDB reviews for sequence-classification fine-tuning.

Legend: b batch, n tokens of one example, L max length.

GLUE files are read as GLUE/HF do (tab-separated, ``csv.QUOTE_NONE``: quotes are text), with columns
found by header name; a row with the wrong number of fields is an error naming the file and line.
IMDB is the ``aclImdb`` folder (``{train,test}/{neg,pos}/*.txt``, neg = 0, pos = 1; ``<br />`` becomes a
space). Examples are encoded as ``[CLS] a [SEP] (b [SEP])`` with longest-first truncation.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nystrom_lab.data.constants import FINETUNE_TASKS
from nystrom_lab.data.file_checks import DataFileError, decode_text_file
from nystrom_lab.data.text import TextTokenizer


@dataclass(frozen=True)
class GlueSpec:
    folder: str
    text_a: str
    text_b: str | None
    label: str
    labels: tuple[str, ...]  # label strings; class id = position
    dev: tuple[str, ...]  # dev file(s); the first selects the model
    test: tuple[str, ...]


GLUE_SPECS: dict[str, GlueSpec] = {
    "sst2": GlueSpec("SST-2", "sentence", None, "label", ("0", "1"), ("dev.tsv",), ("test.tsv",)),
    "mrpc": GlueSpec("MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), ("dev.tsv",), ("test.tsv",)),
    "qnli": GlueSpec(
        "QNLI", "question", "sentence", "label", ("entailment", "not_entailment"), ("dev.tsv",), ("test.tsv",)
    ),
    "qqp": GlueSpec("QQP", "question1", "question2", "is_duplicate", ("0", "1"), ("dev.tsv",), ("test.tsv",)),
    "mnli": GlueSpec(
        "MNLI",
        "sentence1",
        "sentence2",
        "gold_label",
        ("contradiction", "entailment", "neutral"),
        ("dev_matched.tsv", "dev_mismatched.tsv"),
        ("test_matched.tsv", "test_mismatched.tsv"),
    ),
}
IMDB_LABELS = ("neg", "pos")


@dataclass
class Examples:
    """Raw examples of one split: ``index`` (for prediction files), texts, labels (class ids; None = unlabelled)."""

    name: str
    index: list[str]
    text_a: list[str]
    text_b: list[str] | None
    labels: list[int] | None
    label_names: tuple[str, ...]


def task_folder(root: str | os.PathLike[str], task: str) -> Path:
    """``root/<GLUE folder>`` (or ``root`` itself when it already is that folder); ``root`` for IMDB."""
    root = Path(root)
    if task == "imdb":
        return root
    spec = GLUE_SPECS[task]
    return root / spec.folder if (root / spec.folder).is_dir() else root


def read_tsv(path: Path, *, display: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and ``(line number, fields)`` rows of a GLUE TSV; ``display`` names the file when missing.

    Raises :class:`~nystrom_lab.data.DataFileError` (file and line) for an empty file, undecodable bytes, a NUL
    or an over-long field, or a row whose field count differs from the header's.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{display}: file not found ({path})")
    csv.field_size_limit(1 << 24)
    text = decode_text_file(path.read_bytes(), path)  # MRPC's files start with a BOM
    rows: list[tuple[int, list[str]]] = []
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        header = next(reader, None)
        if header is None:
            raise DataFileError(path, "the file is empty (expected a header line)", line=1)
        for fields in reader:
            if not fields:
                continue  # trailing empty line
            if len(fields) != len(header):
                raise DataFileError(
                    path,
                    f"expected {len(header)} tab-separated fields, got {len(fields)}",
                    line=reader.line_num,
                )
            rows.append((reader.line_num, fields))
    except csv.Error as exc:
        raise DataFileError(path, f"not a readable TSV ({exc})", line=reader.line_num) from None
    return header, rows


def _column(header: list[str], name: str, path: Path) -> int:
    if name not in header:
        raise DataFileError(path, f"no column {name!r} in the header {header}", line=1)
    return header.index(name)


def load_glue_file(root: str | os.PathLike[str], task: str, filename: str, *, labelled: bool) -> Examples:
    """One GLUE TSV (``train.tsv``, ``dev*.tsv`` with labels; ``test*.tsv`` without)."""
    spec = GLUE_SPECS[task]
    folder = task_folder(root, task)
    path = folder / filename
    header, rows = read_tsv(path, display=f"{spec.folder}/{filename}")
    if not rows:
        raise DataFileError(path, "no examples after the header (an empty split)")
    ca = _column(header, spec.text_a, path)
    cb = _column(header, spec.text_b, path) if spec.text_b else None
    ci = next((header.index(c) for c in ("index", "id") if c in header), None)
    for line, fields in rows:
        if not any(fields[c].strip() for c in (ca, cb) if c is not None):
            raise DataFileError(path, "empty example: no text in its text column(s)", line=line)
    labels: list[int] | None = None
    if labelled:
        cl = _column(header, spec.label, path)
        labels = []
        for line, fields in rows:
            if fields[cl] not in spec.labels:
                raise DataFileError(
                    path, f"label {fields[cl][:40]!r} is not one of {list(spec.labels)}", line=line
                )
            labels.append(spec.labels.index(fields[cl]))
    return Examples(
        name=f"{task}/{Path(filename).stem}",
        index=[fields[ci] if ci is not None else str(k) for k, (_, fields) in enumerate(rows)],
        text_a=[fields[ca] for _, fields in rows],
        text_b=[fields[cb] for _, fields in rows] if cb is not None else None,
        labels=labels,
        label_names=spec.labels,
    )


def load_imdb_reviews(root: str | os.PathLike[str], split: str) -> Examples:
    """``aclImdb/{split}/{neg,pos}/*.txt`` (``split`` = train or test); index = ``pos/123_9``."""
    if split not in ("train", "test"):
        raise ValueError(f"IMDB split must be 'train' or 'test', got {split!r}")
    index, texts, labels = [], [], []
    for label, name in enumerate(IMDB_LABELS):
        folder = Path(root) / split / name
        if not folder.is_dir():
            raise FileNotFoundError(
                f"IMDB folder not found: {folder} (expected aclImdb/{split}/{name}/*.txt)"
            )
        files = sorted(folder.glob("*.txt"), key=lambda p: (len(p.stem), p.stem))
        if not files:
            raise DataFileError(folder, "holds no .txt reviews (an empty split)")
        for f in files:
            text = re.sub(r"<br\s*/?>", " ", decode_text_file(f.read_bytes(), f))
            if not text.strip():
                raise DataFileError(f, "empty review (no text)")
            index.append(f"{name}/{f.stem}")
            texts.append(text)
            labels.append(label)
    return Examples(f"imdb/{split}", index, texts, None, labels, IMDB_LABELS)


def load_task(root: str | os.PathLike[str], task: str) -> dict[str, list[Examples]]:
    """``{"train": [...], "dev": [...], "test": [...]}``: dev files are labelled (IMDB: the test
    reviews, as the paper reports); ``test`` holds GLUE's unlabelled test files that exist."""
    if task not in FINETUNE_TASKS:
        raise ValueError(f"task must be one of {FINETUNE_TASKS}, got {task!r}")
    if task == "imdb":
        return {
            "train": [load_imdb_reviews(root, "train")],
            "dev": [load_imdb_reviews(root, "test")],
            "test": [],
        }
    spec = GLUE_SPECS[task]
    folder = task_folder(root, task)
    return {
        "train": [load_glue_file(root, task, "train.tsv", labelled=True)],
        "dev": [load_glue_file(root, task, f, labelled=True) for f in spec.dev],
        "test": [load_glue_file(root, task, f, labelled=False) for f in spec.test if (folder / f).is_file()],
    }


def encode_pair(a: list[int], b: list[int] | None, tok: TextTokenizer, max_length: int):
    """``[CLS] a [SEP] (b [SEP])`` cut longest-first to ``max_length``: ids (n,), token types (n,)."""
    budget = max_length - (3 if b is not None else 2)
    if budget < 2:
        raise ValueError(f"max_length={max_length} leaves no room for text")
    a = list(a)
    b = None if b is None else list(b)
    while len(a) + (len(b) if b is not None else 0) > budget:
        if b is not None and len(b) > len(a):
            b.pop()
        else:
            a.pop()
    ids = [tok.cls_id, *a, tok.sep_id] + ([*b, tok.sep_id] if b is not None else [])
    types = [0] * (len(a) + 2) + ([1] * (len(b) + 1) if b is not None else [])
    return np.asarray(ids, dtype=np.int64), np.asarray(types, dtype=np.int64)


class ClassificationDataset(Sequence):
    """Encoded examples: items ``{"input_ids" (n,), "token_type_ids" (n,), "labels" ()}`` (no labels
    when the split is unlabelled)."""

    def __init__(
        self, examples: Examples, tokenizer: TextTokenizer, *, max_length: int, limit: int | None = None
    ):
        count = len(examples.text_a) if limit is None else min(limit, len(examples.text_a))
        self.examples = examples
        self.index = examples.index[:count]
        ta = tokenizer.encode(examples.text_a[:count])
        tb = tokenizer.encode(examples.text_b[:count]) if examples.text_b is not None else [None] * count
        self.items = [encode_pair(a, b, tokenizer, max_length) for a, b in zip(ta, tb)]
        full = [len(a) + (2 if b is None else len(b) + 3) for a, b in zip(ta, tb)]  # tokens before the cut
        #: examples cut to ``max_length`` and the tokens they lost (reported, never silent)
        self.truncated = sum(n > max_length for n in full)
        self.tokens_dropped = sum(max(0, n - max_length) for n in full)
        self.max_length = max_length
        self.labels = examples.labels[:count] if examples.labels is not None else None

    def __len__(self) -> int:
        return len(self.items)

    def truncation_note(self, name: str) -> str | None:
        """One line saying how many examples were cut to ``max_length`` (None when none was)."""
        if not self.truncated:
            return None
        return (
            f"{name}: {self.truncated} of {len(self)} examples longer than {self.max_length} tokens were cut"
            f" ({self.tokens_dropped:,} tokens dropped, {self.tokens_dropped / self.truncated:,.0f} per cut example);"
            " a longer model keeps them: nystrom convert long --init-from SRC --max-length N"
        )

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, types = self.items[i]
        item = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types)}
        if self.labels is not None:
            item["labels"] = torch.tensor(self.labels[i])
        return item


def collate_classification(items: list[dict], *, pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to the longest item: ``input_ids``, ``attention_mask``, ``token_type_ids`` (b, n), ``labels`` (b,)."""
    n = max(len(i["input_ids"]) for i in items)
    ids = torch.full((len(items), n), pad_id, dtype=torch.long)  # (b, n)
    types = torch.zeros((len(items), n), dtype=torch.long)
    mask = torch.zeros((len(items), n), dtype=torch.long)
    for r, item in enumerate(items):
        k = len(item["input_ids"])
        ids[r, :k], types[r, :k], mask[r, :k] = item["input_ids"], item["token_type_ids"], 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if "labels" in items[0]:
        batch["labels"] = torch.stack([i["labels"] for i in items])
    return batch
