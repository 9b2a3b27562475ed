"""Loaders for the LRA data people already have on disk: ListOps TSVs, IMDB, AAN pairs.

Legend: N examples, L max_length.

Every loader returns a map-style ``torch.utils.data.Dataset`` whose items are int64 tensors: token ids
padded with 0 to ``max_length`` (truncated first, like LRA's ``inputs[:max_length]``) and an int64 label.
CIFAR-10 is in :mod:`nystrom_lab.data.lra.cifar`, Pathfinder folders in :mod:`nystrom_lab.data.lra.pathfinder_io`.
Everything is validated at load time, before any training: a missing file raises ``FileNotFoundError``;
an empty file or split, an empty example, a bad label or undecodable text raises
:class:`~nystrom_lab.data.DataFileError` naming the file and, for line-based files, the line.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from nystrom_lab.data.file_checks import DataFileError
from nystrom_lab.data.lra.dataset import PairDataset, RaggedTokens, SequenceDataset
from nystrom_lab.data.lra.listops import SPLIT_FILES, read_listops_tsv
from nystrom_lab.data.lra.tokenize import check_max_length, encode_bytes, encode_listops

SPLITS = ("train", "dev", "test")
IMDB_SPLIT_DIRS = {"train": "train", "dev": "test", "test": "test"}  # LRA validates IMDB on its test set
AAN_SPLIT_FILES = {"train": "train", "dev": "eval", "test": "test"}
AAN_MAX_BYTES = 10_000  # LRA encodes s[:10000] before cutting to max_length


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def load_listops(
    root: str | os.PathLike[str], *, split: str, task: str = "basic", max_length: int = 2000
) -> SequenceDataset:
    """ListOps ``split`` from ``root/{task}_{train,val,test}.tsv`` (the LRA release names).

    Items: ``(ids (L,) int64, label () int64)`` with ids from :data:`tokenize.LISTOPS_VOCAB`.
    """
    path = Path(root) / f"{task}_{SPLIT_FILES[check_split(split)]}.tsv"
    return load_listops_file(path, max_length=max_length)


def load_listops_file(path: str | os.PathLike[str], *, max_length: int = 2000) -> SequenceDataset:
    """One LRA ListOps TSV as a :class:`SequenceDataset` (see :func:`load_listops`)."""
    check_max_length(max_length)
    p = Path(path)
    rows = read_listops_tsv(p)
    if not rows:
        raise DataFileError(p, "no examples after the header (an empty split)")
    seqs = []
    for lineno, (src, _) in enumerate(rows, start=2):
        try:
            ids = encode_listops(src, max_length=max_length, where="")
        except ValueError as err:
            raise DataFileError(p, str(err), line=lineno) from None
        if ids.size == 0:
            raise DataFileError(p, "empty example: the Source holds no ListOps symbol", line=lineno)
        seqs.append(ids)
    labels = np.fromiter((y for _, y in rows), dtype=np.int64, count=len(rows))
    return SequenceDataset(RaggedTokens(seqs, dtype=np.uint8), labels, max_length=max_length, source=str(p))


def _imdb_key(path: Path) -> tuple[int, int, str]:
    stem = path.stem.split("_")
    if len(stem) == 2 and stem[0].isdigit() and stem[1].isdigit():
        return int(stem[0]), int(stem[1]), path.name
    return 1 << 62, 0, path.name


def load_imdb(root: str | os.PathLike[str], *, split: str, max_length: int = 4000) -> SequenceDataset:
    """Byte-level IMDB from an ``aclImdb`` folder: ``{train,test}/{neg,pos}/*.txt``, neg = 0, pos = 1.

    Ids are ``byte + 1`` of the file's raw bytes (LRA's ``ByteTextEncoder``), 0 = pad. ``dev`` reads the
    test folder because LRA uses the IMDB test set for validation. Items: ``(ids (L,), label ())`` int64.
    """
    check_max_length(max_length)
    base = Path(root) / IMDB_SPLIT_DIRS[check_split(split)]
    seqs, labels = [], []
    for label, name in ((0, "neg"), (1, "pos")):
        folder = base / name
        if not folder.is_dir():
            raise FileNotFoundError(f"IMDB folder not found: {folder}")
        files = sorted(folder.glob("*.txt"), key=_imdb_key)
        if not files:
            raise DataFileError(folder, "holds no .txt reviews (an empty split)")
        for f in files:
            with open(f, "rb") as fh:
                head = fh.read(max_length)  # LRA keeps the first max_length bytes; never read more
            if not head.strip():
                raise DataFileError(f, "empty review (no text)")
            seqs.append(encode_bytes(head, max_length=max_length))
            labels.append(label)
    tokens = RaggedTokens(seqs, dtype=np.uint16)
    return SequenceDataset(tokens, np.asarray(labels), max_length=max_length, source=str(base))


def _aan_label(field: bytes, path: Path, lineno: int) -> int:
    try:
        value = float(field)  # LRA reads the label column as a float
    except ValueError:
        value = -1.0
    if value not in (0.0, 1.0):
        shown = field[:20].decode(errors="replace")
        raise DataFileError(path, f"label must be 0 or 1, got {shown!r}", line=lineno)
    return int(value)


def load_aan(root: str | os.PathLike[str], *, split: str, max_length: int = 4000) -> PairDataset:
    """LRA retrieval pairs from ``root/new_aan_pairs.{train,eval,test}.tsv`` (``dev`` reads ``eval``).

    Each line: ``label \\t id1 \\t id2 \\t text1 \\t text2`` without a header or quoting; the label is read
    as a float (LRA's column default) and must be 0 or 1. Texts are encoded as bytes + 1 from their first
    10000 bytes, then cut to ``max_length``. Items: ``(ids1 (L,), ids2 (L,), label ())`` int64.
    """
    check_max_length(max_length)
    path = Path(root) / f"new_aan_pairs.{AAN_SPLIT_FILES[check_split(split)]}.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"AAN TSV not found: {path}")
    first, second, labels = [], [], []
    with open(path, "rb") as f:  # streamed: the release's train file is large
        for lineno, line in enumerate(f, start=1):
            fields = line.rstrip(b"\n").rstrip(b"\r").split(b"\t")
            if len(fields) != 5:
                raise DataFileError(path, f"expected 5 tab-separated fields, got {len(fields)}", line=lineno)
            labels.append(_aan_label(fields[0], path, lineno))
            for out, text, column in ((first, fields[3], 4), (second, fields[4], 5)):
                if not text.strip():
                    raise DataFileError(path, f"empty example: text field {column} is blank", line=lineno)
                out.append(encode_bytes(text[:AAN_MAX_BYTES], max_length=max_length))
    if not labels:
        raise DataFileError(path, "empty file, expected 'label\\tid1\\tid2\\ttext1\\ttext2' lines", line=1)
    a, b = RaggedTokens(first, dtype=np.uint16), RaggedTokens(second, dtype=np.uint16)
    return PairDataset(a, b, np.asarray(labels), max_length=max_length, source=str(path))
