"""The pre-training data in packed rows: document pieces tile every document once, in order, their masks and
positions are the stream's, packed rows keep documents apart by construction, and the declared example
lengths are the items' (MLM pieces and MLM + SOP pairs)."""

from __future__ import annotations

import numpy as np
import torch

from nystrom_lab.data.packed_batches import PackedRows, collate_packed
from nystrom_lab.data.text_mlm import PackedMLMDataset
from nystrom_lab.data.text_mlm_documents import DocumentMLMDataset
from nystrom_lab.data.text_pretrain import PretrainingDataset, split_documents


def unmasked(item: dict) -> torch.Tensor:
    return torch.where(item["labels"] >= 0, item["labels"], item["input_ids"])


def test_document_pieces_tile_every_document_once_in_order(corpus, tok):
    data = DocumentMLMDataset(corpus, tok, split="train", seq_len=40, dev_fraction=0.1, dupe_factor=2)
    assert len(data) == 2 * data.pieces
    docs = split_documents(corpus.num_documents, 0.1)["train"]
    text = []
    for j in range(data.pieces):
        item = data[j]
        ids = item["input_ids"]
        assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id and len(ids) == data.example_lengths[j] <= 40
        assert torch.equal(unmasked(data[data.pieces + j]), unmasked(item))  # a copy: same text, own masks
        text.append(unmasked(item)[1:-1])
    want = [np.asarray(corpus.tokens[corpus.document_segments(int(d))[0] : corpus.document_segments(int(d))[-1]])
            for d in docs]  # fmt: skip
    assert torch.equal(torch.cat(text), torch.as_tensor(np.concatenate(want), dtype=torch.long))
    assert data.pieces > len(docs)  # some documents are longer than a row: cut into pieces of their own
    assert (
        data.piece_offset[data.piece_offset > 0] % 38 == 0
    ).all()  # a later piece starts at a multiple of c


def test_fixed_masks_and_positions_are_the_streams_under_every_layout(corpus, tok):
    """A dev token is masked the same way as in the stream layout, and keyed by its place in its document."""
    kw = dict(split="dev", dev_fraction=0.2, fixed_masks=True)
    stream = PackedMLMDataset(corpus, tok, seq_len=96, **kw)
    pieces = DocumentMLMDataset(corpus, tok, seq_len=24, reference_length=96, **kw)
    whole = DocumentMLMDataset(corpus, tok, seq_len=400, **kw)  # every document in one piece

    def scored(data) -> list[tuple[int, int]]:
        out = []
        for i in range(len(data)):
            it = data[i]
            sel = it["labels"] >= 0
            out += zip(it["labels"][sel].tolist(), it["input_ids"][sel].tolist())
        return out

    assert scored(pieces) == scored(stream) == scored(whole)
    assert whole.pieces == len(split_documents(corpus.num_documents, 0.2)["dev"])
    for j in range(whole.pieces):  # L = R: a token's key is its own position
        it = whole[j]
        assert torch.equal(it["positions"], torch.arange(len(it["input_ids"])))
    long = DocumentMLMDataset(corpus, tok, seq_len=96, **kw)
    keys = torch.cat([pieces[j]["positions"][1:-1] for j in range(pieces.pieces)])
    want = torch.cat([long[j]["positions"][1:-1] for j in range(long.pieces)])
    assert torch.equal(keys, want)  # 24-token pieces keyed by the place their tokens have in 96-token rows


def test_packed_rows_of_pieces_keep_documents_apart(corpus, tok):
    docs = DocumentMLMDataset(corpus, tok, split="train", seq_len=64, dev_fraction=0.1, seed=3)
    rows = PackedRows(docs, docs.example_lengths, max_length=64, seed=3)
    assert len(rows) < docs.pieces and rows.layout.padding_share() < 0.2
    batch = collate_packed([rows[r] for r in range(len(rows))], pad_id=tok.pad_id, pad_to=64)
    cu = batch["cu_seq_lens_q"].long()
    flat = {k: batch[k].reshape(-1) for k in ("input_ids", "labels", "positions", "attention_mask")}
    pieces = [docs[int(j)] for r in range(len(rows)) for j in rows.layout.row(r)]
    assert len(pieces) == len(cu) - 1
    for d, piece in enumerate(pieces):  # span d is piece d and nothing else (its tail padding masked)
        n = len(piece["input_ids"])
        lo, hi = int(cu[d]), int(cu[d + 1])
        for k in ("input_ids", "labels", "positions"):
            assert torch.equal(flat[k][lo : lo + n], piece[k])
        assert flat["attention_mask"][lo : lo + n].all() and not flat["attention_mask"][lo + n : hi].any()
        assert torch.equal(batch["position_ids"].reshape(-1)[lo:hi], torch.arange(hi - lo))


def test_pair_lengths_are_the_items_lengths_for_every_draw(corpus, tok):
    data = PretrainingDataset(corpus, tok, split="train", seq_len=32, seed=5, dupe_factor=3)
    lengths = data.example_lengths
    n = len(data.instances)
    assert all(len(data[c * n + j]["input_ids"]) == lengths[j] for c in range(3) for j in range(n))
    rows = PackedRows(data, lengths, max_length=32, seed=5, copies=3)
    batch = collate_packed([rows[i] for i in range(0, len(rows), 7)], pad_id=tok.pad_id, pad_to=32)
    d = len(batch["cu_seq_lens_q"]) - 1
    assert (
        batch["sentence_order_label"].shape == (d,)
        and batch["token_type_ids"].shape == batch["input_ids"].shape
    )
    starts = batch["cu_seq_lens_q"][:-1].long()
    assert (batch["input_ids"].reshape(-1)[starts] == tok.cls_id).all()  # every pair starts with its [CLS]
    assert (batch["token_type_ids"].reshape(-1)[starts] == 0).all()
