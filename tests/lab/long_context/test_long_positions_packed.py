"""``long-positions`` with packed documents (issue item 7): the layout a variant's name says and its folder
records, equal real tokens, the plan of the one command that runs the comparison (children faked: nothing
trains) and its within-document scoring of every variant (hand-made documents: test_long_positions_within)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from nystrom_lab.argtypes import UsageError
from nystrom_lab.cli import build_parser
from nystrom_lab.data.text_mlm import PackedMLMDataset
from nystrom_lab.long_context import run as long_run
from nystrom_lab.long_context.experiment import experiment_packing
from nystrom_lab.long_context.positions import (
    CONTINUED,
    PositionsRun,
    chosen_variants,
    prepare_variant,
    split_variant,
    variant_layout,
)
from nystrom_lab.long_context.positions_budget import (
    item_tokens,
    real_tokens,
    run_items,
    step_tokens,
    steps_for_budget,
    token_cache,
)
from nystrom_lab.long_context.positions_commands import plan, stages_of
from nystrom_lab.long_context.positions_packed import within_summary, within_tables
from nystrom_lab.long_context.positions_within import within_document
from nystrom_lab.training.loop import global_batch

PACKED_RUN = "copy-local-nystrom-packed"
ONE_COMMAND = [PACKED_RUN, CONTINUED, "copy-local-nystrom"]


def arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_a_variants_name_says_its_layout(tiny_source):
    run = tiny_source
    assert (
        split_variant(PACKED_RUN) == ("copy", "local-nystrom") and variant_layout(PACKED_RUN) == "documents"
    )
    assert variant_layout("copy-local-nystrom") == variant_layout(CONTINUED) == "stream"
    packed, stream = run.pretrain_args(PACKED_RUN), run.pretrain_args("copy-local-nystrom")
    assert (arg(packed, "--packing"), arg(stream, "--packing")) == ("documents", "stream")
    assert (
        arg(run.pretrain_args(CONTINUED), "--packing")
        == arg(run.pretrain_args("source"), "--packing")
        == "stream"
    )
    assert arg(packed, "--init-from") == arg(stream, "--init-from")  # one conversion, two layouts
    assert (arg(packed, "--seed"), arg(packed, "--dev-seed"), arg(packed, "--out")) == (
        "1",
        "0",
        str(run.out / PACKED_RUN),
    )
    args = build_parser().parse_args(
        ["pretrain", "long-positions", "--corpus", run.corpus[0], "--variants", *ONE_COMMAND]
    )
    assert args.variants == ONE_COMMAND
    with pytest.raises(ValueError, match="unknown variant"):
        split_variant("copy-local-nystrom-stream")
    step0 = {"copy-local-nystrom": {"mlm_acc": 0.3}, "hier0.1-nystrom": {"mlm_acc": 0.2}}
    stream_plan = ("copy-local-nystrom", CONTINUED, "hier0.1-nystrom", "copy-nystrom")
    assert chosen_variants(dataclasses.replace(run, packing="stream"), step0) == stream_plan
    assert chosen_variants(run, step0) == tuple(v if v == CONTINUED else v + "-packed" for v in stream_plan)


def test_the_folder_records_its_layout_and_refuses_another(tiny_source, tmp_path, capsys):
    run = tiny_source
    assert run.packing == "documents" == experiment_packing(None, tmp_path / "new")  # a new folder packs
    run.write_settings()
    record = json.loads((run.out / "settings.json").read_text())
    assert record["packing"] == "documents" and PositionsRun.from_record(record).packing == "documents"

    def cli(*extra: str) -> int:
        args = build_parser().parse_args(["pretrain", "long-positions", "--corpus", run.corpus[0], "--out", str(run.out),
                                          *extra, "--plan-only"])  # fmt: skip
        return args.func(args)

    with pytest.raises(UsageError, match="holds a --packing documents experiment"):
        cli("--packing", "stream")
    assert cli() == 0 and "copy-nystrom-packed" in capsys.readouterr().out  # kept: the default plan packs
    old = tmp_path / "old"  # a folder of before the option: its runs are stream runs
    old.mkdir()
    (old / "settings.json").write_text(json.dumps({"corpus": ["c"], "steps": 200}))
    assert (
        experiment_packing(None, old) == "stream"
        and PositionsRun.from_record({"corpus": ["c"]}).packing == "stream"
    )
    with pytest.raises(ValueError, match="holds a --packing stream experiment"):
        experiment_packing("documents", old)
    assert (
        "packing" not in dataclasses.replace(run, packing="stream").record()
    )  # written as before the option
    with pytest.raises(ValueError, match="documents or stream"):
        PositionsRun(corpus=("c",), packing="off")


def test_item_tokens_and_the_budget_by_hand():
    stream = item_tokens(np.array([10, 20]), layout="stream", length=8, seed=0, copies=2)
    assert stream.tolist() == [8] * 5 + [4] + [8] * 5 + [
        4
    ]  # 32 stream tokens in pieces of 6, [CLS] + [SEP] each
    rows = item_tokens(np.array([10, 3]), layout="documents", length=8, seed=0, copies=1)
    assert sorted(rows.tolist()) == [5, 6, 8]  # pieces 6 + 2, 4 + 2, 3 + 2: no two share a row of 8
    items = np.array([8, 6, 5] * 4)
    s = steps_for_budget(items, 40, batch=2, seed=3)
    per = step_tokens(items, s, batch=2, seed=3)
    assert per[:-1].sum() < 40 <= per.sum()
    with pytest.raises(ValueError, match="positive"):
        steps_for_budget(items, 0, batch=2, seed=0)


def test_a_packed_run_trains_until_it_has_seen_the_stream_runs_real_tokens(tiny_source):
    from nystrom_lab.data.packed_batches import PackedRows
    from nystrom_lab.data.text_mlm_documents import DocumentMLMDataset

    run = tiny_source
    budget, steps = run.steps * run.tokens_per_step, run.variant_steps(PACKED_RUN)
    before, after = real_tokens(run, PACKED_RUN, [steps - 1, steps])
    assert before < budget <= after and steps > run.steps  # padding: more steps for the same real tokens
    assert (
        real_tokens(run, "copy-local-nystrom", [run.steps])[0] <= budget
    )  # full rows but a short last piece
    # the real tokens counted are those of the batches the training loop builds (text.mlm, training.loop)
    corpus, tok = token_cache(run)
    seed, length, b = run.seed + 1, run.long_length, run.tokens_per_step // run.long_length
    kw = dict(
        split="train", seq_len=length, dev_fraction=run.dev_fraction, seed=seed, dupe_factor=run.dupe_factor
    )
    docs = DocumentMLMDataset(corpus, tok, **kw)
    layouts = {"documents": PackedRows(docs, docs.example_lengths, max_length=length, seed=seed,
                                       copies=run.dupe_factor), "stream": PackedMLMDataset(corpus, tok, **kw)}  # fmt: skip
    for name, data in zip((PACKED_RUN, "copy-local-nystrom"), layouts.values()):
        loop = [sum(len(data[i]["input_ids"]) for i in global_batch(len(data), s, b, seed)) for s in range(3)]
        assert loop == step_tokens(run_items(run, name), 3, batch=b, seed=seed).tolist(), name


def test_the_one_command_plans_and_launches_the_packed_comparison_in_order(tiny_source, monkeypatch, capsys):
    run = tiny_source
    assert stages_of(["all"], tuple(ONE_COMMAND)) == ("source", "train", "within", "report")  # no screen
    assert stages_of(["all"], ()) == ("source", "screen", "train", "within", "report")
    assert stages_of(["report", "train"], ()) == ("train", "report")
    entries = plan(run, tuple(ONE_COMMAND))
    assert [e["run"] for e in entries] == ["source", *ONE_COMMAND]
    assert [(e["layout"], e["length"]) for e in entries] == [("stream", 512), ("documents", 1024), ("stream", 512),
                                                             ("stream", 1024)]  # fmt: skip
    assert entries[0]["finished"] and not any(
        e["finished"] for e in entries[1:]
    )  # the source has its weights
    assert entries[1]["steps"] > entries[2]["steps"] == entries[3]["steps"] == run.steps
    assert entries[1]["real_tokens"] >= run.steps * run.tokens_per_step >= entries[3]["real_tokens"]
    launched, real_run = [], long_run.subprocess.run

    def fake_run(
        cmd: list[str], **kw
    ):  # a child run of nystrom pretrain: its folder as a finished run leaves it
        if "nystrom_lab.cli" not in cmd:
            return real_run(cmd, **kw)  # anything else (platform's uname) runs
        out = Path(arg(cmd, "--out"))
        launched.append((out.name, arg(cmd, "--packing"), arg(cmd, "--init-from")))
        shutil.copytree(arg(cmd, "--init-from"), out / "model")
        (out / "results.json").write_text(json.dumps({"step": int(arg(cmd, "--steps"))}))

    monkeypatch.setattr(long_run.subprocess, "run", fake_run)
    args = build_parser().parse_args(["pretrain", "long-positions", "--corpus", run.corpus[0], "--out", str(run.out),
                                      "--stages", "source", "train", "--variants", *ONE_COMMAND, "--no-progress"])  # fmt: skip
    assert args.func(args) == 0
    start = str(run.out / "models" / "copy-local-nystrom")
    assert launched == [(PACKED_RUN, "documents", start), (CONTINUED, "stream", str(run.out / "source" / "model")),
                        ("copy-local-nystrom", "stream", start)]  # fmt: skip
    assert "1. source" in capsys.readouterr().out
    args.func(args)  # resumed: every run finished, nothing launched again
    assert len(launched) == 3


def test_within_document_scores_every_variant_on_the_same_tokens_and_says_what_packing_changed(tiny_source):
    run = tiny_source
    for v in ONE_COMMAND:  # "trained" models: the starts as they are (the scoring is checked, not training)
        start = run.out / "source" / "model" if v == CONTINUED else prepare_variant(run, v)
        shutil.copytree(start, run.out / v / "model")
        (run.out / v / "results.json").write_text(json.dumps({"step": 2, "best_step": 2}))
    variants = (*ONE_COMMAND, "hier0.1-nystrom")  # one without weights: skipped
    within_document(run, variants, cross=False, device="cpu", progress=False)  # each in its own layout
    found = within_document(run, (CONTINUED,), device="cpu", progress=False)  # and window-512 in the other
    own = {f"{PACKED_RUN}@documents", f"{CONTINUED}@stream", "copy-local-nystrom@stream"}
    assert set(found) == {*own, f"{CONTINUED}@documents"}
    assert len({json.dumps(e["masked_by_bucket"]) for e in found.values()}) == 1  # the same masked tokens
    stamp = (run.out / "within" / f"{PACKED_RUN}@documents.json").stat().st_mtime_ns
    assert within_document(run, variants, cross=False, device="cpu", progress=False) == found  # read back
    assert (run.out / "within" / f"{PACKED_RUN}@documents.json").stat().st_mtime_ns == stamp
    summary = within_summary(found)
    assert summary["same_masked_tokens"] and set(summary["variants"]) == set(ONE_COMMAND)
    assert summary["variants"][PACKED_RUN]["trained_layout"] == "documents"
    assert summary["other_layout"][CONTINUED]["layout"] == "documents"  # 512-token windows of each document
    assert summary["variants"][PACKED_RUN]["real_tokens_seen"] == real_tokens(run, PACKED_RUN, [2])[0]
    md = within_tables(summary)
    assert "| copy-local-nystrom-packed | documents 1024 |" in md and f"vs {CONTINUED} (points)" in md
    assert "Packing by documents (copy-local-nystrom-packed against copy-local-nystrom" in md
