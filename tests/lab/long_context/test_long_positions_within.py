"""``long-positions`` scored by position within the document: offsets and buckets by hand, the same masked tokens
in every layout and length on hand-made documents, and the sentences that say what packing changed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nystrom.model import NystromformerConfig, NystromformerForMaskedLM
from nystrom_lab.data.text import TextTokenizer
from nystrom_lab.data.text_mlm import PackedMLMDataset
from nystrom_lab.long_context.positions import CONTINUED
from nystrom_lab.long_context.positions_packed import packing_sentences, within_summary
from nystrom_lab.long_context.positions_within import (
    BUCKETS,
    bucket_of,
    dev_rows,
    document_starts,
    score,
    within_offsets,
)

PACKED_RUN = "copy-local-nystrom-packed"


class HandCorpus:
    """Documents of known lengths whose token ids say their offset in the document (100 + offset)."""

    def __init__(self, lengths: list[int]) -> None:
        self.tokens = np.concatenate([100 + np.arange(n) for n in lengths]).astype(np.int64)
        self.bounds = np.concatenate([[0], np.cumsum(lengths)])
        self.num_documents, self.folder = len(lengths), Path("hand")

    def document_segments(self, d: int) -> np.ndarray:
        return np.asarray([self.bounds[d], self.bounds[d + 1]])


HAND_TOK = TextTokenizer(tokenizer=None, path=Path("hand.json"), vocab_size=3000, cls_id=1, sep_id=2, mask_id=3,
                         pad_id=0, unk_id=4)  # fmt: skip


def test_offsets_and_buckets_by_hand():
    starts = document_starts(np.array([3, 5, 2]))  # stream: 3 tokens [SEP] 5 tokens [SEP] 2 tokens [SEP]
    assert starts.tolist() == [0, 4, 10]
    assert within_offsets(np.array([0, 2, 3, 4, 8, 9, 10, 11]), starts).tolist() == [0, 2, 3, 0, 4, 5, 0, 1]
    assert bucket_of(np.array([0, 511, 512, 1023, 1024, 2047, 2048, 5000])).tolist() == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]


def test_within_document_buckets_are_right_in_every_layout_on_hand_made_documents():
    # dev (every other document): 2600, 1500 and 900 tokens; a masked token's label is 100 + its true offset
    corpus = HandCorpus([2600, 700, 1500, 300, 2100, 900])
    hand = PackedMLMDataset(corpus, HAND_TOK, split="dev", seq_len=512, dev_fraction=0.5, fixed_masks=True)
    labels = hand.stream_labels[hand.stream_labels != -100]
    want = np.bincount(bucket_of(labels - 100), minlength=len(BUCKETS))  # masked tokens per bucket, by hand
    assert (want > 0).all()
    model = NystromformerForMaskedLM(NystromformerConfig(
        vocab_size=3000, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=1024, attention="softmax", dropout=0.0))  # fmt: skip
    for layout in ("stream", "documents"):
        for length in (512, 1024):
            data, collate = dev_rows(corpus, HAND_TOK, layout=layout, length=length, dev_fraction=0.5, seed=0,
                                     reference_length=4096)  # fmt: skip
            got, row_starts = np.zeros(len(BUCKETS), dtype=np.int64), []
            for item in data:
                sel = item["labels"] != -100
                assert (item["positions"][sel] == item["labels"][sel] - 100).all(), (layout, length)
                got += np.bincount(bucket_of(item["positions"][sel].numpy()), minlength=len(BUCKETS))
                first = item["labels"][1] if item["labels"][1] != -100 else item["input_ids"][1]
                row_starts.append(int(first) - 100)  # the row's first token: its offset in its document
            assert got.tolist() == want.tolist(), (layout, length)  # the same masked tokens in every layout
            if layout == "documents":  # a packed row starts a document, or a piece of one at k·(L - 2)
                assert all(s % (length - 2) == 0 for s in row_starts)
            else:  # a stream row starts wherever the previous one ended
                assert any(s % (length - 2) != 0 for s in row_starts if s >= 0)
        res = score(model, data, collate, batch_size=2, precision="fp32", device="cpu")
        assert res["masked_by_bucket"] == dict(zip(BUCKETS, want.tolist())) and res["masked"] == want.sum()
        assert all(0.0 <= a <= 1.0 for a in res["mlm_acc_by_bucket"].values())
    stream_rows, _ = dev_rows(corpus, HAND_TOK, layout="stream", length=1024, dev_fraction=0.5, seed=0,
                              reference_length=4096)  # fmt: skip
    assert int(stream_rows[1]["positions"][1]) == 1022  # a stream row of 1024 starts mid-document


def _entry(name: str, layout: str, accs: list[float | None], trained: str | None = None) -> dict:
    return {"variant": name, "layout": layout, "trained_layout": trained or layout, "length": 4096,
            "real_tokens_seen": 3_300_000, "masked": 10, "mlm_acc": accs[0],
            "mlm_acc_by_bucket": dict(zip(BUCKETS, accs[1:])), "masked_by_bucket": dict.fromkeys(BUCKETS, 1)}  # fmt: skip


def test_the_sentences_say_what_packing_changed_bucket_by_bucket():
    own = {CONTINUED: _entry(CONTINUED, "stream", [0.30, 0.30, 0.30, 0.29, 0.31]),
           "copy-local-nystrom": _entry("copy-local-nystrom", "stream", [0.29, 0.30, 0.29, 0.28, 0.28]),
           PACKED_RUN: _entry(PACKED_RUN, "documents", [0.305, 0.30, 0.295, 0.30, 0.32])}  # fmt: skip
    other = {
        "copy-local-nystrom": _entry(
            "copy-local-nystrom", "documents", [0.30, 0.30, 0.30, 0.29, 0.30], "stream"
        )
    }
    said = packing_sentences(own, other)
    assert said[0].startswith(f"Packing by documents ({PACKED_RUN} against copy-local-nystrom")
    assert "(+1.50 points)" in said[0] and "up in 3 of 4 buckets (most in ≥ 2048, +4.00)" in said[0]
    assert "unchanged within 0.05 points in [0, 512)" in said[0]
    assert (
        "the target (overall and every bucket ≥ window-512-continued) is not met (below in overall" in said[1]
    )
    assert said[2].startswith(f"{PACKED_RUN} (documents) against {CONTINUED}: +0.50 points overall")
    assert "is not met (below in [512, 1024))" in said[2]
    assert said[3].startswith(
        "copy-local-nystrom, trained on stream rows, scored on documents rows instead: +1.00"
    )
    summary = within_summary({f"{e['variant']}@{e['layout']}": e for e in [*own.values(), *other.values()]})
    assert summary["target"] == {"copy-local-nystrom": {"met": False, "below": ["overall", *BUCKETS[1:]]},
                                 PACKED_RUN: {"met": False, "below": ["[512, 1024)"]}}  # fmt: skip
