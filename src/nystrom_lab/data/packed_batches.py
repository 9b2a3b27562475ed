"""Packed rows of a data set's examples, and their batches in the layout the models take.

Legend: b rows of a batch, n tokens per row of the batch, k documents of a row, D documents of the batch.

:class:`PackedRows` turns a map-style data set of examples (each a document: per-token tensors such as
``input_ids`` (t,), and per-document ones such as ``sentence_order_label`` ()) into rows by
:func:`~nystrom_lab.data.packing.pack_rows`. :func:`collate_packed` lays b rows out as the models'
packed-document contract (transformers' keyword names, FlashAttention's offsets):

- ``input_ids``, ``attention_mask`` (1 = real), ``labels`` (-100 where no loss) and every other per-token
  key, (b, n); a row shorter than n is padded at its end, and that padding belongs to the row's last
  document (masked by ``attention_mask``), so every row starts a document;
- ``position_ids`` (b, n): 0, 1, ... restarting at every document (the padding continues its document's);
- ``cu_seq_lens_q`` = ``cu_seq_lens_k``: int32 (D + 1,) offsets of the documents in the b·n tokens read
  row after row (one tensor under both names); ``max_length_q`` = ``max_length_k``: the longest
  document (its padding included), a Python int;
- per-document keys, (D,) in the order of ``cu_seq_lens``.

The models' forward takes these keys (:data:`PACKING_KEYS`) beside ``input_ids`` and ``attention_mask``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from nystrom_lab.data.packing import RowLayout, pack_rows

#: the keys of a packed batch that describe its documents, passed to the model as they are
PACKING_KEYS = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
#: per-document keys the lab's data sets give (one value per example, not per token)
PER_DOCUMENT = ("sentence_order_label",)


def packing_kwargs(batch: dict) -> dict:
    """The packed-document keys of ``batch`` (none for a padded or stream batch)."""
    return {k: batch[k] for k in PACKING_KEYS if k in batch}


class PackedRows(Sequence):
    """Rows of ``base``'s examples packed by :func:`~nystrom_lab.data.packing.pack_rows`.

    ``lengths`` (E,): the tokens of examples 0..E-1 (each at most ``max_length``; checked when a row is
    built). ``copies``: ``base`` holds ``copies`` · E examples, example ``c·E + j`` being example j's c-th
    draw (masks, segment order: the lab's ``dupe_factor``); every copy is packed with the same layout, so
    item ``c·R + r`` is row r of copy c. Item: the rows' per-token tensors concatenated (t,),
    ``document_lengths`` (k,) and the per-document keys stacked (k,).
    """

    def __init__(
        self, base: Sequence, lengths: np.ndarray, *, max_length: int, seed: int = 0, copies: int = 1
    ) -> None:
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if len(base) != copies * len(lengths):
            raise ValueError(
                f"the data set holds {len(base)} examples, not copies × lengths = {copies} × {len(lengths)}"
            )
        self.base, self.example_lengths, self.copies = base, lengths, copies
        self.layout: RowLayout = pack_rows(lengths, max_length, seed=seed)
        if len(self.layout) == 0:
            raise ValueError("no example to pack: the data set is empty")

    # no ``lengths`` attribute: evaluation orders a data set by its ``lengths`` (training.evaluate), and rows
    # are no examples of those lengths
    @property
    def row_lengths(self) -> np.ndarray:
        """Tokens of each row of one copy: (R,)."""
        return self.layout.row_lengths

    def __len__(self) -> int:
        return len(self.layout) * self.copies

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} out of range [0, {len(self)})")
        copy, r = divmod(i, len(self.layout))
        pieces = self.layout.row(r)
        items = [self.base[copy * len(self.example_lengths) + int(j)] for j in pieces]
        for j, item in zip(pieces, items):
            if len(item["input_ids"]) != self.example_lengths[j]:
                raise ValueError(
                    f"example {int(j)} has {len(item['input_ids'])} tokens but its length was given as"
                    f" {int(self.example_lengths[j])}: the lengths passed to PackedRows do not describe the data set"
                )
        out = {
            k: torch.cat([it[k] for it in items])
            if items[0][k].dim()
            else torch.stack([it[k] for it in items])
            for k in items[0]
        }
        out["document_lengths"] = torch.as_tensor(self.example_lengths[pieces], dtype=torch.long)
        return out


def collate_packed(
    rows: list[dict], *, pad_id: int, pad_to: int | None = None, per_document: tuple[str, ...] = PER_DOCUMENT
) -> dict:
    """Packed rows (items of :class:`PackedRows`) as a batch of the module's layout, each row padded at its end
    to ``pad_to`` (default: the longest row). ``per_document`` keys are concatenated to (D,)."""
    n = max(int(r["document_lengths"].sum()) for r in rows) if pad_to is None else pad_to
    b = len(rows)
    token_keys = [k for k in rows[0] if k != "document_lengths" and k not in per_document]
    fill = {"input_ids": pad_id, "labels": -100}
    out = {k: torch.full((b, n), fill.get(k, 0), dtype=rows[0][k].dtype) for k in token_keys}
    mask = torch.zeros((b, n), dtype=torch.long)
    positions = torch.zeros((b, n), dtype=torch.long)
    spans: list[torch.Tensor] = []
    for r, row in enumerate(rows):
        lengths = row["document_lengths"].clone()  # (k,)
        t = int(lengths.sum())
        if t > n or len(row["input_ids"]) != t:
            raise ValueError(
                f"row {r} has {len(row['input_ids'])} tokens for documents of {t}; it must hold at most"
                f" pad_to={n}: pack with max_length <= pad_to"
            )
        for k in token_keys:
            out[k][r, :t] = row[k]
        mask[r, :t] = 1
        lengths[-1] += n - t  # the padding belongs to the row's last document
        starts = torch.cumsum(lengths, 0) - lengths  # (k,)
        positions[r] = torch.arange(n) - torch.repeat_interleave(starts, lengths)
        spans.append(lengths)
    lengths = torch.cat(spans)  # (D,)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    longest = int(lengths.max())
    batch = {"input_ids": out.pop("input_ids"), "attention_mask": mask, **out, "position_ids": positions}
    batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    for k in per_document:
        if k in rows[0]:
            batch[k] = torch.cat([row[k] for row in rows])
    return batch
