"""Documents packed into rows: the one rule the lab's pre-training paths share (no padding, no cross-talk).

Legend: D documents, P pieces, R rows, L row length (``--max-length``).

The rule (:func:`cut_lengths`, then :func:`pack_rows`):

1. **Cut.** A document longer than L tokens is cut into consecutive pieces of L (the last one shorter).
   Every piece is a document of its own from then on: it attends only to itself, so a long document's
   second piece does not see its first.
2. **Order.** The pieces are taken in a seeded permutation, so the layout is a pure function of
   ``(lengths, L, seed)``: a resumed run, every DDP rank and a second machine build the same rows.
3. **Fill.** First fit: each piece in that order goes into the first row (lowest index) with room for it,
   else it opens a new row. Every row starts a document, no piece crosses a row, no row exceeds L, and
   the only padding is each row's tail (up to L minus its tokens), which the collator masks and counts
   as part of the row's last document (:func:`nystrom_lab.data.packed_batches.collate_packed`).

What it buys depends on the length mix (Brown, MiniLM's WordPiece, train split, measured with
``python -m nystrom_lab.bench.packing``): padding 8.6 % -> 0.7 % of the tokens at L = 512 and 36.7 % ->
1.3 % at L = 2048, but 36.8 % -> 36.8 % at L = 4096, where every Brown document (2,261-3,299 tokens) is one
piece and no two fit a row. First fit runs in O(P log P) with a max-tree over the rows' free room.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: salt of the packing order's generator (so that it never equals another draw seeded with the same seed)
_ORDER_SALT = 0x9AC


def _check_length(max_length: int) -> None:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be an int >= 1 (tokens per row), got {max_length!r}")


def cut_lengths(lengths: np.ndarray, max_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces of documents of ``lengths`` (D,) cut at ``max_length``: ``(document (P,), start (P,), length
    (P,))``, in document order, a document's pieces in text order. Empty documents give no piece."""
    _check_length(max_length)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if (lengths < 0).any():
        raise ValueError(f"document lengths must be >= 0, got {int(lengths.min())}")
    counts = -(-lengths // max_length)  # (D,) pieces per document
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)  # (P,)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)  # (D,) index of each first piece
    k = np.arange(len(doc), dtype=np.int64) - np.repeat(first, counts)  # (P,) piece number in its document
    start = k * max_length
    return doc, start, np.minimum(lengths[doc] - start, max_length)


@dataclass(frozen=True)
class RowLayout:
    """Rows of packed pieces: row r holds pieces ``items[offsets[r]:offsets[r + 1]]`` in that order.

    ``items`` (P,) piece indices, ``offsets`` (R + 1,), ``row_lengths`` (R,) tokens per row, ``max_length`` L.
    """

    items: np.ndarray
    offsets: np.ndarray
    row_lengths: np.ndarray
    max_length: int

    def __len__(self) -> int:
        return len(self.row_lengths)

    def row(self, r: int) -> np.ndarray:
        """The piece indices of row ``r``, in row order: (k,)."""
        return self.items[self.offsets[r] : self.offsets[r + 1]]

    @property
    def tokens(self) -> int:
        """Real tokens over all rows."""
        return int(self.row_lengths.sum())

    def padding_share(self, pad_to: int | None = None) -> float:
        """Padded tokens / all tokens when every row is padded to ``pad_to`` (default L)."""
        return padding_share(self.row_lengths, pad_to or self.max_length)


def padding_share(row_lengths: np.ndarray, pad_to: int) -> float:
    """Padded tokens / all tokens of rows of ``row_lengths`` (R,) each padded to ``pad_to``."""
    row_lengths = np.asarray(row_lengths, dtype=np.int64)
    if len(row_lengths) == 0:
        return 0.0
    if int(row_lengths.max()) > pad_to:
        raise ValueError(f"a row holds {int(row_lengths.max())} tokens, more than pad_to={pad_to}")
    return 1.0 - float(row_lengths.sum()) / (len(row_lengths) * pad_to)


class _FirstFit:
    """Free room of rows in a max-tree: the first row with room for k tokens in O(log R)."""

    def __init__(self, capacity: int, max_rows: int) -> None:
        size = 1
        while size < max(1, max_rows):
            size *= 2
        self.size = size
        self.tree = [capacity] * (2 * size)  # every leaf an empty row; inner nodes: max of children

    def place(self, k: int) -> int:
        """Put k tokens into the first row with room (there always is one); return its index."""
        tree, i = self.tree, 1
        while i < self.size:
            i = 2 * i if tree[2 * i] >= k else 2 * i + 1
        tree[i] -= k
        row = i - self.size
        i //= 2
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i //= 2
        return row


def pack_rows(lengths: np.ndarray, max_length: int, *, seed: int = 0) -> RowLayout:
    """Pack pieces of ``lengths`` (P,) (each 1..``max_length``) into rows by the module's rule (seeded order,
    first fit). Cut longer documents first with :func:`cut_lengths`."""
    _check_length(max_length)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if len(lengths) and (int(lengths.min()) < 1 or int(lengths.max()) > max_length):
        bad = int(np.flatnonzero((lengths < 1) | (lengths > max_length))[0])
        raise ValueError(
            f"piece {bad} has {int(lengths[bad])} tokens; every piece needs 1..{max_length} (max_length):"
            " cut longer documents with cut_lengths first and drop empty ones"
        )
    order = np.random.default_rng([seed, _ORDER_SALT]).permutation(len(lengths))  # (P,)
    fit = _FirstFit(max_length, len(lengths))
    rows = np.fromiter((fit.place(int(lengths[p])) for p in order), dtype=np.int64, count=len(order))
    by_row = np.argsort(rows, kind="stable")  # pieces grouped by row, in the order they were placed
    items = order[by_row]
    counts = np.bincount(rows, minlength=int(rows.max()) + 1 if len(rows) else 0)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    row_lengths = np.bincount(rows, weights=lengths[order], minlength=len(counts)).astype(np.int64)
    return RowLayout(items=items, offsets=offsets, row_lengths=row_lengths, max_length=max_length)
