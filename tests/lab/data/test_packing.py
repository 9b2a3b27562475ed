"""The packing rule (nystrom_lab.data.packing) and the packed batches' layout (packed_batches.collate_packed):
every real token once, in order, rows that start documents, offsets that agree with the positions, no row over
max_length, determinism; fuzzed over random document lengths (HYPOTHESIS_PROFILE=long: 2000 cases)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nystrom_lab.data.packed_batches import PACKING_KEYS, PackedRows, collate_packed, packing_kwargs
from nystrom_lab.data.packing import cut_lengths, pack_rows, padding_share


class Documents:
    """Examples whose every token names its document and place: token = 1000·(document + 1) + offset."""

    def __init__(self, lengths, copies: int = 1) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.copies = copies

    def __len__(self) -> int:
        return len(self.lengths) * self.copies

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        copy, j = divmod(i, len(self.lengths))
        ids = 1000 * (j + 1) + torch.arange(int(self.lengths[j]))
        return {
            "input_ids": ids,
            "labels": ids + copy,
            "sentence_order_label": torch.tensor(j),  # one value per example
        }


def check_layout(lengths: np.ndarray, max_length: int, seed: int) -> None:
    """Every invariant of pack_rows on pieces of ``lengths`` (each 1..max_length)."""
    layout = pack_rows(lengths, max_length, seed=seed)
    assert sorted(layout.items.tolist()) == list(range(len(lengths)))  # every piece exactly once
    assert len(layout.offsets) == len(layout) + 1 and layout.offsets[-1] == len(lengths)
    for r in range(len(layout)):
        row = layout.row(r)
        assert len(row) >= 1 and lengths[row].sum() == layout.row_lengths[r] <= max_length
    assert layout.tokens == lengths.sum()
    # first fit: a row opened only when no earlier row had room for its first piece (rows only fill up)
    free = max_length - layout.row_lengths  # (R,)
    for q in range(1, len(layout)):
        assert (free[:q] < lengths[layout.row(q)[0]]).all()
    again = pack_rows(lengths, max_length, seed=seed)
    assert np.array_equal(again.items, layout.items) and np.array_equal(again.offsets, layout.offsets)


@given(
    st.lists(st.integers(0, 300), min_size=1, max_size=60),
    st.integers(1, 128),
    st.integers(0, 2**31 - 1),
)
def test_fuzz_cut_then_pack(doc_lengths, max_length, seed):
    doc_lengths = np.asarray(doc_lengths)
    doc, start, length = cut_lengths(doc_lengths, max_length)
    assert (length >= 1).all() and (length <= max_length).all()
    for d, t in enumerate(doc_lengths):  # a document's pieces tile it, in order
        mine = doc == d
        assert length[mine].sum() == t
        assert np.array_equal(start[mine], np.concatenate([[0], np.cumsum(length[mine])[:-1]])[: mine.sum()])
        assert (length[mine][:-1] == max_length).all()  # only the last piece is short
    if len(length):
        check_layout(length, max_length, seed)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(40, 64), st.integers(0, 99))
def test_fuzz_collated_rows_keep_every_token_once_in_order_and_apart(lengths, max_length, seed):
    rows = PackedRows(Documents(lengths), lengths, max_length=max_length, seed=seed)
    batch = collate_packed([rows[i] for i in range(len(rows))], pad_id=-1, pad_to=max_length)
    ids, mask, pos = batch["input_ids"], batch["attention_mask"].bool(), batch["position_ids"]
    b, n = ids.shape
    cu = batch["cu_seq_lens_q"]
    assert cu.dtype == torch.int32 and batch["cu_seq_lens_k"] is cu
    assert int(cu[0]) == 0 and int(cu[-1]) == b * n and (cu[1:] > cu[:-1]).all()
    assert set(range(0, b * n, n)) <= set(cu.tolist())  # every row starts a document
    spans = (cu[1:] - cu[:-1]).long()
    assert batch["max_length_q"] == batch["max_length_k"] == int(spans.max())
    flat_pos = pos.reshape(-1)
    starts = torch.zeros(b * n, dtype=torch.bool)
    starts[cu[:-1].long()] = True
    assert torch.equal(flat_pos == 0, starts)  # positions restart exactly where cu_seq_lens starts a document
    assert torch.equal(flat_pos, torch.arange(b * n) - torch.repeat_interleave(cu[:-1].long(), spans))
    real = ids.reshape(-1)[mask.reshape(-1)]
    assert sorted(real.tolist()) == sorted(
        t for j, k in enumerate(lengths) for t in range(1000 * (j + 1), 1000 * (j + 1) + k)
    )
    for d in range(len(spans)):  # one document per span, whole and in order (the padding only at a row's end)
        seg = ids.reshape(-1)[cu[d] : cu[d + 1]]
        keep = mask.reshape(-1)[cu[d] : cu[d + 1]]
        assert keep[: int(keep.sum())].all() and not keep[int(keep.sum()) :].any()
        toks = seg[keep]
        assert len(set((toks // 1000).tolist())) == 1 and torch.equal(toks % 1000, torch.arange(len(toks)))
    assert torch.equal(batch["sentence_order_label"], (ids.reshape(-1)[cu[:-1].long()] // 1000) - 1)
    assert (batch["labels"][~mask] == -100).all() and (ids[~mask] == -1).all()


def test_pieces_of_an_over_long_document_are_documents_of_their_own():
    doc, start, length = cut_lengths(np.array([10, 3, 0, 7]), 4)
    assert doc.tolist() == [0, 0, 0, 1, 3, 3] and start.tolist() == [0, 4, 8, 0, 0, 4]
    assert length.tolist() == [4, 4, 2, 3, 4, 3]  # the empty document gives no piece
    layout = pack_rows(length, 4, seed=0)
    assert (layout.row_lengths <= 4).all() and layout.tokens == 20


def test_the_seed_reorders_and_first_fit_fills_rows():
    lengths = np.array([6, 5, 4, 3, 2, 1, 1])  # 22 tokens: 3 rows of 8 at best
    layouts = [pack_rows(lengths, 8, seed=s) for s in range(6)]
    for seed, lay in enumerate(layouts):
        check_layout(lengths, 8, seed)
        assert len(lay) <= 4 and lay.tokens == 22
    assert len({tuple(lay.items.tolist()) for lay in layouts}) > 1  # the seed changes the order
    assert padding_share(np.array([8, 4]), 8) == pytest.approx(0.25)
    assert layouts[0].padding_share() == pytest.approx(1 - 22 / (8 * len(layouts[0])))


def test_copies_share_the_layout_and_read_their_own_draws():
    lengths = [5, 3, 7, 2]
    rows = PackedRows(Documents(lengths, copies=3), lengths, max_length=8, seed=1, copies=3)
    r = len(rows.layout)
    assert len(rows) == 3 * r
    for i in range(r):
        a, c = rows[i], rows[2 * r + i]
        assert torch.equal(a["input_ids"], c["input_ids"]) and torch.equal(c["labels"], a["labels"] + 2)
        assert torch.equal(a["document_lengths"], torch.as_tensor([lengths[j] for j in rows.layout.row(i)]))


def test_errors_say_how_to_fix():
    with pytest.raises(ValueError, match="cut longer documents with cut_lengths"):
        pack_rows(np.array([3, 9]), 8)
    with pytest.raises(ValueError, match="copies × lengths"):
        PackedRows(Documents([3, 4]), [3, 4, 5], max_length=8)
    with pytest.raises(ValueError, match="do not describe the data set"):
        bad = PackedRows(Documents([3, 4]), [3, 5], max_length=8)
        [bad[i] for i in range(len(bad))]
    rows = PackedRows(Documents([6, 6]), [6, 6], max_length=8)
    with pytest.raises(ValueError, match="pack with max_length <= pad_to"):
        collate_packed([rows[0]], pad_id=0, pad_to=4)


def test_packing_kwargs_take_only_the_packed_keys():
    rows = PackedRows(Documents([3, 2]), [3, 2], max_length=8)
    batch = collate_packed([rows[0]], pad_id=0)
    assert next(iter(batch)) == "input_ids"  # evaluate() counts rows by the first key
    assert set(packing_kwargs(batch)) == set(PACKING_KEYS)
    assert packing_kwargs({"input_ids": batch["input_ids"]}) == {}
