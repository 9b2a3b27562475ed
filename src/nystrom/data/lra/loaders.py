"""Loaders for the LRA data people already have on disk: ListOps TSVs, IMDB, AAN pairs, CIFAR-10.

Legend: N examples, L max_length, W image side (32).

Every loader returns a map-style ``torch.utils.data.Dataset`` whose items are int64 tensors: token ids
padded with 0 to ``max_length`` (truncated first, like LRA's ``inputs[:max_length]``) and an int64 label.
Pathfinder folders are loaded by :func:`nystrom.data.lra.pathfinder_io.load_pathfinder`. Missing files
raise ``FileNotFoundError`` and malformed ones ``ValueError``, naming the file and, for text, the line.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from nystrom.data.lra.dataset import PairDataset, PixelDataset, RaggedTokens, SequenceDataset
from nystrom.data.lra.listops import SPLIT_FILES, read_listops_tsv
from nystrom.data.lra.tokenize import check_max_length, encode_bytes, encode_listops

SPLITS = ("train", "dev", "test")
IMDB_SPLIT_DIRS = {"train": "train", "dev": "test", "test": "test"}  # LRA validates IMDB on its test set
AAN_SPLIT_FILES = {"train": "train", "dev": "eval", "test": "test"}
AAN_MAX_BYTES = 10_000  # LRA encodes s[:10000] before cutting to max_length
CIFAR_TRAIN_SIZE = 45_000  # LRA: tfds train[:90%] / train[90%:]


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def load_listops(
    root: str | os.PathLike[str], *, split: str, task: str = "basic", max_length: int = 2000
) -> SequenceDataset:
    """ListOps ``split`` from ``root/{task}_{train,val,test}.tsv`` (the LRA release names).

    Items: ``(ids (L,) int64, label () int64)`` with ids from :data:`tokenize.LISTOPS_VOCAB`.
    """
    path = Path(root) / f"{task}_{SPLIT_FILES[_check_split(split)]}.tsv"
    return load_listops_file(path, max_length=max_length)


def load_listops_file(path: str | os.PathLike[str], *, max_length: int = 2000) -> SequenceDataset:
    """One LRA ListOps TSV as a :class:`SequenceDataset` (see :func:`load_listops`)."""
    check_max_length(max_length)
    p = Path(path)
    rows = read_listops_tsv(p)
    seqs = [
        encode_listops(src, max_length=max_length, where=f"{p.name} line {i + 2}")
        for i, (src, _) in enumerate(rows)
    ]
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
    base = Path(root) / IMDB_SPLIT_DIRS[_check_split(split)]
    seqs, labels = [], []
    for label, name in ((0, "neg"), (1, "pos")):
        folder = base / name
        if not folder.is_dir():
            raise FileNotFoundError(f"IMDB folder not found: {folder}")
        files = sorted(folder.glob("*.txt"), key=_imdb_key)
        if not files:
            raise ValueError(f"IMDB folder {folder} holds no .txt reviews")
        for f in files:
            seqs.append(encode_bytes(f.read_bytes(), max_length=max_length))
            labels.append(label)
    tokens = RaggedTokens(seqs, dtype=np.uint16)
    return SequenceDataset(tokens, np.asarray(labels), max_length=max_length, source=str(base))


def load_aan(root: str | os.PathLike[str], *, split: str, max_length: int = 4000) -> PairDataset:
    """LRA retrieval pairs from ``root/new_aan_pairs.{train,eval,test}.tsv`` (``dev`` reads ``eval``).

    Each line: ``label \\t id1 \\t id2 \\t text1 \\t text2`` without a header or quoting; the label is read
    as a float (LRA's column default) and must be 0 or 1. Texts are encoded as bytes + 1 from their first
    10000 bytes, then cut to ``max_length``. Items: ``(ids1 (L,), ids2 (L,), label ())`` int64.
    """
    check_max_length(max_length)
    path = Path(root) / f"new_aan_pairs.{AAN_SPLIT_FILES[_check_split(split)]}.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"AAN TSV not found: {path}")
    first, second, labels = [], [], []
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for lineno, line in enumerate(lines, start=1):
        fields = line.rstrip(b"\r").split(b"\t")
        if len(fields) != 5:
            raise ValueError(f"{path.name} line {lineno}: expected 5 tab-separated fields, got {len(fields)}")
        try:
            value = float(fields[0])
        except ValueError:
            value = -1.0
        if value not in (0.0, 1.0):
            raise ValueError(
                f"{path.name} line {lineno}: label must be 0 or 1, got {fields[0][:20].decode(errors='replace')!r}"
            )
        labels.append(int(value))
        first.append(encode_bytes(fields[3][:AAN_MAX_BYTES], max_length=max_length))
        second.append(encode_bytes(fields[4][:AAN_MAX_BYTES], max_length=max_length))
    if not labels:
        raise ValueError(
            f"{path.name} line 1: empty file, expected 'label\\tid1\\tid2\\ttext1\\ttext2' lines"
        )
    a, b = RaggedTokens(first, dtype=np.uint16), RaggedTokens(second, dtype=np.uint16)
    return PairDataset(a, b, np.asarray(labels), max_length=max_length, source=str(path))


def cifar_to_grey(data: np.ndarray) -> np.ndarray:
    """CIFAR rows (N, 3*W*W) uint8 (R, G, B planes) to grey levels (N, W*W) uint8.

    As ``tf.image.rgb_to_grayscale`` on uint8 (LRA's image pipeline): scale to [0, 1] in float32, weigh
    0.2989 R + 0.5870 G + 0.1140 B, and convert back with ``convert_image_dtype``, i.e.
    ``floor(g * 255.5)``.
    """
    rgb = data.reshape(data.shape[0], 3, -1).astype(np.float32) / np.float32(255)  # (N, 3, W*W)
    w = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
    grey = np.einsum("c,ncp->np", w, rgb)  # (N, W*W)
    return np.floor(grey * np.float32(255.5)).astype(np.uint8)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR-10 batch not found: {path}")
    with open(path, "rb") as f:
        try:
            batch = pickle.load(f, encoding="bytes")  # the official python pickles
        except Exception as exc:
            raise ValueError(f"{path}: not a CIFAR-10 python pickle ({exc})") from exc
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path}: expected a dict with keys b'data' and b'labels'")
    data, labels = np.asarray(batch[b"data"]), np.asarray(batch[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (data.shape[0],):
        raise ValueError(
            f"{path}: expected b'data' (N, 3072) uint8 and b'labels' (N,), got {data.shape} {data.dtype}"
            f" and {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{path}: labels must lie in 0..9")
    return data, labels


def load_cifar10(
    root: str | os.PathLike[str], *, split: str, train_size: int = CIFAR_TRAIN_SIZE
) -> PixelDataset:
    """Grey CIFAR-10 from ``cifar-10-batches-py``: items ``((1024,) int64 in 0..255, label ())``.

    train = the first ``train_size`` (45000) images of ``data_batch_1..5`` in file order, dev = the rest, test =
    ``test_batch`` (LRA slices tfds ``train[:90%]``/``train[90%:]``; tfds order differs from file order).
    """
    base = Path(root)
    if _check_split(split) == "test":
        data, labels = _read_cifar_batch(base / "test_batch")
    else:
        parts = [_read_cifar_batch(base / f"data_batch_{i}") for i in range(1, 6)]
        data = np.concatenate([d for d, _ in parts])
        labels = np.concatenate([y for _, y in parts])
        if not 0 < train_size < data.shape[0]:
            raise ValueError(f"train_size must lie in 1..{data.shape[0] - 1} for {base}, got {train_size}")
        cut = slice(0, train_size) if split == "train" else slice(train_size, None)
        data, labels = data[cut], labels[cut]
    return PixelDataset(cifar_to_grey(data), labels, source=f"{base} [{split}]")
