"""Compact map-style datasets of token sequences, padded with 0 on access.

Legend: N examples, L max_length (the padded length every item has).

Sequences are stored ragged (one flat array plus offsets, in the smallest integer dtype that holds the ids)
because the LRA sets are large: AAN at 4000 bytes per document as dense int64 would need ~9 GB. Items are
returned as int64 tensors padded to ``max_length``, the form an ``nn.Embedding`` expects.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from nystrom_lab.data.lra.tokenize import PAD_ID, check_max_length


class RaggedTokens:
    """``N`` variable-length id sequences in one flat array; ``self[i]`` is ``(n_i,)`` of ``dtype``."""

    def __init__(self, sequences: Sequence[np.ndarray], *, dtype: np.dtype | type = np.uint16) -> None:
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))  # (N,)
        self.offsets = np.zeros(len(sequences) + 1, dtype=np.int64)  # (N + 1,)
        np.cumsum(lengths, out=self.offsets[1:])
        self.flat = np.empty(int(self.offsets[-1]), dtype=dtype)
        for i, s in enumerate(sequences):
            self.flat[self.offsets[i] : self.offsets[i + 1]] = s

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        """``(N,)`` int64 token counts."""
        return np.diff(self.offsets)


def _padded(tokens: np.ndarray, max_length: int) -> torch.Tensor:
    out = torch.full((max_length,), PAD_ID, dtype=torch.int64)  # (L,)
    out[: tokens.shape[0]] = torch.from_numpy(tokens.astype(np.int64))
    return out


def _check_labels(labels: np.ndarray, n: int) -> np.ndarray:
    labels = np.asarray(labels, dtype=np.int64)
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {labels.shape}")
    return labels


class SequenceDataset(Dataset):
    """Single-sequence classification: item ``i`` is ``(tokens (L,) int64, label () int64)``.

    ``tokens`` are the stored ids right-padded with 0 to ``max_length``; every stored sequence must already
    be at most ``max_length`` long (loaders truncate first, as LRA does).
    """

    def __init__(self, tokens: RaggedTokens, labels: np.ndarray, *, max_length: int, source: str) -> None:
        self.max_length = check_max_length(max_length)
        if len(tokens) and int(tokens.lengths.max()) > max_length:
            raise ValueError(f"{source}: a sequence is longer than max_length={max_length}")
        self.tokens = tokens
        self.labels = _check_labels(labels, len(tokens))  # (N,)
        self.source = source

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _padded(self.tokens[i], self.max_length), torch.tensor(int(self.labels[i]))

    @property
    def lengths(self) -> np.ndarray:
        """(N,) real length of each item; the training loop batches full evaluations by it."""
        return self.tokens.lengths

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All items at once: ``(inputs (N, L) int64, labels (N,) int64)``; for small sets and tests."""
        inputs = torch.zeros((len(self), self.max_length), dtype=torch.int64)  # (N, L)
        for i in range(len(self)):
            seq = self.tokens[i]
            inputs[i, : seq.shape[0]] = torch.from_numpy(seq.astype(np.int64))
        return inputs, torch.from_numpy(self.labels.copy())


class PairDataset(Dataset):
    """Two-sequence classification (LRA retrieval): item ``i`` is ``(a (L,), b (L,), label ())``, int64."""

    def __init__(
        self, first: RaggedTokens, second: RaggedTokens, labels: np.ndarray, *, max_length: int, source: str
    ) -> None:
        self.max_length = check_max_length(max_length)
        if len(first) != len(second):
            raise ValueError(f"{source}: {len(first)} first documents but {len(second)} second documents")
        for part in (first, second):
            if len(part) and int(part.lengths.max()) > max_length:
                raise ValueError(f"{source}: a document is longer than max_length={max_length}")
        self.first, self.second = first, second
        self.labels = _check_labels(labels, len(first))  # (N,)
        self.source = source

    def __len__(self) -> int:
        return len(self.first)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = _padded(self.first[i], self.max_length)  # (L,)
        b = _padded(self.second[i], self.max_length)  # (L,)
        return a, b, torch.tensor(int(self.labels[i]))


class PixelDataset(Dataset):
    """Fixed-length grey-level images: item ``i`` is ``(pixels (H*W,) int64 in 0..255, label () int64)``."""

    def __init__(self, pixels: np.ndarray, labels: np.ndarray, *, source: str, skipped: int = 0) -> None:
        if pixels.ndim != 2 or pixels.dtype != np.uint8:
            raise ValueError(
                f"{source}: pixels must be a (N, H*W) uint8 array, got {pixels.shape} {pixels.dtype}"
            )
        self.pixels = pixels  # (N, H*W)
        self.labels = _check_labels(labels, pixels.shape[0])  # (N,)
        self.source = source
        self.skipped = skipped  # examples left out on purpose (e.g. Pathfinder's empty PNGs)

    def __len__(self) -> int:
        return self.pixels.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.pixels[i].astype(np.int64)), torch.tensor(int(self.labels[i]))

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs (N, H*W) int64, labels (N,) int64)``."""
        return torch.from_numpy(self.pixels.astype(np.int64)), torch.from_numpy(self.labels.copy())
