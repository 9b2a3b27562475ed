"""CIFAR-10 from the official python batches, read without running code from them.

Legend: N images, W image side (32).

The batches (``cifar-10-batches-py/data_batch_1..5``, ``test_batch``) are pickles; they are read by the
restricted unpickler of :mod:`nystrom_lab.data.lra.cifar_pickle`, which admits only the numpy-array and dtype
names those files use and refuses anything else with :class:`~nystrom_lab.data.DataFileError` naming the file,
before any object of the file exists.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from nystrom_lab.data.file_checks import DataFileError
from nystrom_lab.data.lra.cifar_pickle import load_batch
from nystrom_lab.data.lra.dataset import PixelDataset
from nystrom_lab.data.lra.loaders import check_split

CIFAR_TRAIN_SIZE = 45_000  # LRA: tfds train[:90%] / train[90%:]
CIFAR_ROW = 3 * 32 * 32  # R, G, B planes of one 32x32 image
CIFAR_MAX_FILE_BYTES = 1 << 30  # an official batch is 31 MB; refuse to read a multi-GB file into memory


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


def read_cifar_batch(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """One official batch: ``data`` (N, 3072) uint8 and ``labels`` (N,) int64 in 0..9, N >= 1.

    Raises ``FileNotFoundError`` when missing and :class:`~nystrom_lab.data.DataFileError` for anything else
    (a refused global, a truncated or corrupt pickle, wrong keys, shapes, dtypes or labels).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"CIFAR-10 batch not found: {p}")
    size = p.stat().st_size
    if size > CIFAR_MAX_FILE_BYTES:
        raise DataFileError(p, f"{size} bytes is far more than a CIFAR-10 batch (31 MB)")
    batch = load_batch(p.read_bytes(), p)
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataFileError(p, "expected a dict with keys b'data' and b'labels'")
    data, labels = batch[b"data"], batch[b"labels"]
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != CIFAR_ROW
    ):
        shown = f"{data.shape} {data.dtype}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataFileError(p, f"expected b'data' as an (N, {CIFAR_ROW}) uint8 array, got {shown}")
    if isinstance(labels, np.ndarray) and labels.ndim == 1 and labels.dtype.kind in "iu":
        labels = labels.tolist()  # a re-pickled batch may hold an int array
    if not isinstance(labels, list) or not all(type(y) is int and 0 <= y <= 9 for y in labels):
        raise DataFileError(p, "expected b'labels' as a list of ints in 0..9")
    if len(labels) != data.shape[0]:
        raise DataFileError(p, f"{data.shape[0]} images but {len(labels)} labels")
    if not labels:
        raise DataFileError(p, "the batch holds no images")
    return data, np.asarray(labels, dtype=np.int64)


def load_cifar10(
    root: str | os.PathLike[str], *, split: str, train_size: int = CIFAR_TRAIN_SIZE
) -> PixelDataset:
    """Grey CIFAR-10 from ``cifar-10-batches-py``: items ``((1024,) int64 in 0..255, label ())``.

    train = the first ``train_size`` (45000) images of ``data_batch_1..5`` in file order, dev = the rest, test =
    ``test_batch`` (LRA slices tfds ``train[:90%]``/``train[90%:]``; tfds order differs from file order).
    """
    base = Path(root)
    if check_split(split) == "test":
        data, labels = read_cifar_batch(base / "test_batch")
    else:
        if isinstance(train_size, bool) or not isinstance(train_size, int):
            raise ValueError(f"train_size must be an int, got {train_size!r}")
        parts = [read_cifar_batch(base / f"data_batch_{i}") for i in range(1, 6)]
        data = np.concatenate([d for d, _ in parts])
        labels = np.concatenate([y for _, y in parts])
        if not 0 < train_size < data.shape[0]:
            raise ValueError(f"train_size must lie in 1..{data.shape[0] - 1} for {base}, got {train_size}")
        cut = slice(0, train_size) if split == "train" else slice(train_size, None)
        data, labels = data[cut], labels[cut]
    return PixelDataset(cifar_to_grey(data), labels, source=f"{base} [{split}]")
