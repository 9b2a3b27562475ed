"""`nystrom pretrain --packing`: the flag off gives today's batches, the default packs where the model can,
packed rows reach the model and see no other document (the same outputs as each document alone), and a run
records its layout and keeps it on resumption.

Every test after the first two needs the models' packed-document keywords (``cu_seq_lens_q`` ...)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nystrom.model import NystromformerConfig, NystromformerForMaskedLM, NystromformerForPreTraining
from nystrom_lab.cli import run_command as main
from nystrom_lab.data.packed_batches import PACKING_KEYS, PackedRows, collate_packed
from nystrom_lab.data.records import read_metrics
from nystrom_lab.data.text import build_token_cache, train_wordpiece
from nystrom_lab.data.text_corpus import resolve_corpus
from nystrom_lab.data.text_mlm import PackedMLMDataset, collate_mlm
from nystrom_lab.data.text_mlm_documents import DocumentMLMDataset
from nystrom_lab.data.text_pretrain import PretrainingDataset, collate_pretraining
from nystrom_lab.text.layout import choose_layout, packing_blocker
from nystrom_lab.text.mlm import make_mlm_task
from nystrom_lab.text.pretrain import PreTrainingObjective, make_task, pretrain_step, run_pretrain
from nystrom_lab.text.pretrain_run import PretrainRun

CORPUS = Path(__file__).parents[2] / "fixtures" / "text" / "corpus"
NYSTROM = {"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 3}


def tiny(tok_size: int, attention, cls=NystromformerForMaskedLM, positions: int = 64):
    cfg = NystromformerConfig.preset(
        "bert-small", vocab_size=tok_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=positions, attention=attention, dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return cls(cfg).eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tokenizer, a tiny MLM folder of ours (Nyström, 64 positions) and a tiny MLM+SOP config JSON."""
    root = tmp_path_factory.mktemp("packing")
    tok = train_wordpiece(sorted(CORPUS.glob("*.txt")), root / "tokenizer.json", vocab_size=300)
    tiny(tok.vocab_size, NYSTROM).save_pretrained(root / "mlm")
    (root / "mlm" / "tokenizer.json").write_bytes((root / "tokenizer.json").read_bytes())
    tiny(tok.vocab_size, NYSTROM).config.to_json_file(root / "tiny.json")
    return root, tok


def pretrain_run(root: Path, out: Path, **kw) -> PretrainRun:
    base = dict(corpus=(str(CORPUS),), out=out, tokenizer=root / "tokenizer.json", init_from=str(root / "tiny.json"),
                max_length=48, steps=1, batch_size=4, dev_fraction=0.2, dropout=0.0)  # fmt: skip
    return PretrainRun(**{**base, **kw})


def test_flag_off_gives_todays_batches(setup, tmp_path):
    root, tok = setup
    task, _ = make_task(pretrain_run(root, tmp_path / "sop", packing="off"))
    assert task.layout == "off" and type(task.train) is PretrainingDataset
    items = [task.train[i] for i in range(4)]
    want = collate_pretraining(items, pad_id=tok.pad_id, pad_to=48)
    got = task.collate(items)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    run = PretrainRun(corpus=(str(CORPUS),), out=tmp_path / "mlm", init_from=str(root / "mlm"), objective="mlm",
                      max_length=40, dev_fraction=0.2, packing="stream")  # fmt: skip
    task, _ = make_mlm_task(run)
    cache = build_token_cache(resolve_corpus([str(CORPUS)], tmp_path), tok, tmp_path / "cache")
    today = PackedMLMDataset(
        cache, tok, split="train", seq_len=40, dev_fraction=0.2, dupe_factor=run.dupe_factor
    )
    assert task.layout == "stream" and len(task.train) == len(today)
    for i in (0, 5, len(today) - 1):
        a, b = task.train[i], today[i]
        assert all(torch.equal(a[k], b[k]) for k in b)
    batch = task.collate([task.train[i] for i in range(3)])
    assert not set(PACKING_KEYS) & set(batch)
    want = collate_mlm([today[i] for i in range(3)], pad_id=tok.pad_id, pad_to=40)
    assert all(torch.equal(batch[k], want[k]) for k in want)


def test_the_default_packs_where_the_model_can_and_says_why_not(setup, tmp_path, capsys):
    _, tok = setup
    linformer = tiny(tok.vocab_size, {"name": "linformer", "proj_len": 8, "max_seq_len": 64})
    assert "LinformerAttention" in packing_blocker(linformer)
    assert choose_layout(None, "mlm", linformer, out=tmp_path) == "stream"
    assert choose_layout(None, "mlm+sop", linformer, out=tmp_path) == "off"
    assert "not packing documents" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"--packing documents: .*train with --packing stream"):
        choose_layout("documents", "mlm", linformer, out=tmp_path)
    with pytest.raises(ValueError, match="applies to --objective mlm only"):
        PretrainRun(corpus=("c",), out=tmp_path, packing="stream")

    class Unpackable(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            return input_ids

    assert "takes no cu_seq_lens_q" in packing_blocker(Unpackable())
    (tmp_path / "pretrain_run.json").write_text(
        json.dumps({"objective": "mlm", "steps": 3})
    )  # before --packing
    assert choose_layout(None, "mlm", Unpackable(), out=tmp_path) == "stream"


def test_packed_rows_give_every_document_what_it_gets_alone(setup, tmp_path):
    _, tok = setup
    cache = build_token_cache(resolve_corpus([str(CORPUS)], tmp_path), tok, tmp_path / "cache")
    docs = DocumentMLMDataset(cache, tok, split="train", seq_len=40, dev_fraction=0.2, seed=1)
    rows = PackedRows(docs, docs.example_lengths, max_length=40, seed=1)
    assert max(len(rows.layout.row(r)) for r in range(6)) > 1  # rows that hold several documents
    for attention in ("softmax", NYSTROM):
        model = tiny(tok.vocab_size, attention)
        assert packing_blocker(model) is None
        batch = collate_packed([rows[r] for r in range(6)], pad_id=tok.pad_id, pad_to=40)
        kw = {k: batch[k] for k in PACKING_KEYS}
        with torch.no_grad():
            hidden = model.nystromformer(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **kw
            )
            hidden = hidden.last_hidden_state.reshape(-1, 32)
            cu = batch["cu_seq_lens_q"].long()
            pieces = [int(j) for r in range(6) for j in rows.layout.row(r)]
            for d, j in enumerate(pieces):
                alone = model.nystromformer(docs[j]["input_ids"][None]).last_hidden_state[0]  # (n, e)
                got = hidden[int(cu[d]) : int(cu[d]) + len(alone)]
                assert torch.allclose(got, alone, atol=2e-5), (attention, d, float((got - alone).abs().max()))


def test_sop_is_scored_per_packed_pair_as_in_a_row_of_its_own(setup, tmp_path):
    _, tok = setup
    cache = build_token_cache(resolve_corpus([str(CORPUS)], tmp_path), tok, tmp_path / "cache")
    pairs = PretrainingDataset(cache, tok, split="train", seq_len=48, seed=2)
    rows = PackedRows(pairs, pairs.example_lengths, max_length=48, seed=2)
    objective = PreTrainingObjective(tiny(tok.vocab_size, NYSTROM, NystromformerForPreTraining))
    packed = collate_packed([rows[r] for r in range(4)], pad_id=tok.pad_id, pad_to=48)
    order = [int(j) for r in range(4) for j in rows.layout.row(r)]
    alone = collate_pretraining([pairs[j] for j in order], pad_id=tok.pad_id, pad_to=48)
    with torch.no_grad():
        _, a = pretrain_step(objective, packed)
        _, b = pretrain_step(objective, alone)
    assert a["sop_accuracy"][1] == b["sop_accuracy"][1] == len(order) > 4  # one SOP example per pair
    for key in ("mlm_accuracy", "sop_accuracy"):
        assert int(a[key][0]) == int(b[key][0])
    assert float(a["sop_loss"][0]) == pytest.approx(float(b["sop_loss"][0]), rel=1e-4)


def test_a_run_records_its_layout_and_keeps_it_when_resumed(setup, tmp_path):
    root, _ = setup
    run = pretrain_run(root, tmp_path / "run")
    run_pretrain(run, progress=False)
    assert json.loads((run.out / "pretrain_run.json").read_text())["packing"] == "documents"
    assert json.loads((run.out / "run.json").read_text())["layout"] == "documents"
    assert json.loads((run.out / "results.json").read_text())["layout"] == "documents"
    run_pretrain(run, progress=False)  # the same command again: the recorded layout, accepted
    with pytest.raises(ValueError, match=r"other options \(packing differ\)"):
        run_pretrain(pretrain_run(root, tmp_path / "run", packing="off"), progress=False)


def test_packed_mlm_scores_dev_as_unpacked_and_unlike_the_stream(setup, tmp_path):
    """Step 0 on the same dev tokens and masks: packed rows give exactly the padded rows' metrics (no
    cross-talk); the stream, whose rows mix documents, does not."""
    root, _ = setup
    dev = {}
    for layout in ("documents", "off", "stream"):
        out = tmp_path / layout
        args = ["pretrain", "--init-from", str(root / "mlm"), "--corpus", str(CORPUS), "--max-length", "64",
                "--batch-size", "4", "--steps", "1", "--eval-at-start", "--dev-fraction", "0.3", "--packing", layout,
                "--out", str(out), "--no-progress"]  # fmt: skip
        assert main(args) == 0
        dev[layout] = next(
            r for r in read_metrics(out / "metrics.jsonl") if r["split"] == "dev" and r["step"] == 0
        )
        assert json.loads((out / "pretrain_run.json").read_text())["packing"] == layout
    for key in ("mlm_loss", "mlm_accuracy", "mlm_loss@0-64"):
        assert dev["documents"][key] == pytest.approx(dev["off"][key], abs=1e-5)
    assert dev["stream"]["mlm_loss"] != pytest.approx(dev["off"]["mlm_loss"], abs=1e-4)
