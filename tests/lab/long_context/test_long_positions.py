"""``nystrom pretrain long-positions`` (position schemes from an MLM-trained source): the runs it launches, the variants it chooses after the
screen, and the screen and report end to end on a tiny 6-layer model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nystrom_lab.long_context import positions
from nystrom_lab.long_context import run as long_run
from nystrom_lab.long_context.positions import (
    CONTINUED,
    PositionsRun,
    chosen_variants,
    finished,
    split_variant,
    train_variant,
)
from nystrom_lab.long_context.positions_report import write_report
from nystrom_lab.long_context.positions_screen import SOURCE_WINDOWS, screen
from nystrom_lab.long_context.positions_targets import targets, targets_table
from nystrom_lab.text.pretrain_run import PretrainRun


def arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_the_runs_it_launches():
    run = PositionsRun(corpus=("c.txt",), out=Path("x"))
    source = run.pretrain_args("source")
    assert arg(source, "--max-length") == "512" and arg(source, "--batch-size") == "32"
    assert arg(source, "--steps") == "300" and arg(source, "--seed") == "0" and "--dev-seed" not in source
    cont = run.pretrain_args(CONTINUED)
    assert arg(cont, "--init-from") == str(Path("x/source/model")) and arg(cont, "--steps") == "200"
    assert (arg(cont, "--seed"), arg(cont, "--dev-seed")) == ("1", "0") and "--lr-scale" not in cont
    nys = run.pretrain_args("hier0.4-nystrom")
    assert arg(nys, "--max-length") == "4096" and arg(nys, "--batch-size") == "4"
    assert nys[nys.index("--lr-scale") + 1 :][:2] == ["*position_embeddings*=10", "*attention.conv.*=10"]
    soft = run.pretrain_args("copy-softmax")
    assert soft[soft.index("--lr-scale") + 1 :] == ["*position_embeddings*=10"]  # no conv to scale
    # every variant sees the same tokens: steps x tokens_per_step
    assert int(arg(cont, "--batch-size")) * 512 == int(arg(nys, "--batch-size")) * 4096 == 16384


def test_names_are_checked():
    assert split_variant("hier0.4-local-nystrom") == ("hier0.4", "local-nystrom")
    for bad in ("copy", "copy-flash", "tile-nystrom"):
        with pytest.raises(ValueError, match="unknown variant"):
            split_variant(bad)
    with pytest.raises(ValueError, match="unknown variant"):
        PositionsRun(corpus=("c",), train_variants=("copy-flash",))


def test_training_takes_copy_and_the_two_best_screened_nystrom_variants():
    step0 = {SOURCE_WINDOWS: {"mlm_acc": 0.5}, "copy-nystrom": {"mlm_acc": 0.9}, "copy-softmax": {"mlm_acc": 0.8},
             "hier0.1-nystrom": {"mlm_acc": 0.2}, "hier0.4-nystrom": {"mlm_acc": 0.3},
             "interpolate-local-nystrom": {"mlm_acc": 0.4}, "copy-block512": {"mlm_acc": 0.45}}  # fmt: skip
    run = PositionsRun(corpus=("c",), packing="stream")  # every folder before packing
    want = ("interpolate-local-nystrom", CONTINUED, "hier0.4-nystrom", "copy-nystrom")
    assert chosen_variants(run, step0) == want
    fixed = PositionsRun(corpus=("c",), train_variants=("hier0.1-nystrom",))
    assert chosen_variants(fixed, step0) == ("hier0.1-nystrom",)


def test_dev_seed_keeps_the_dev_masks_and_needs_mlm():
    with pytest.raises(ValueError, match="--dev-seed applies to --objective mlm only"):
        PretrainRun(corpus=("c",), out=Path("x"), objective="mlm+sop", dev_seed=0)


def test_a_finished_source_without_its_weights_is_trained_again_before_a_conversion(tiny_source, monkeypatch):
    # a fresh checkout holds every run's results (committed) but no weights (not committed)
    run, launched = tiny_source, []
    model = run.out / "source" / "model"
    kept = run.out.parent / "kept-source"
    shutil.move(model, kept)

    def fake_run(cmd: list[str], *, check: bool) -> None:
        out = Path(arg(cmd, "--out"))
        launched.append(out.name)
        if out.name == "source":
            shutil.copytree(kept, out / "model")
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text("{}")

    monkeypatch.setattr(long_run.subprocess, "run", fake_run)
    monkeypatch.setattr(positions, "prepare_source", lambda run: None)  # MiniLM's start: not needed here
    assert finished(run, "source") and not finished(run, "source", weights=True)
    train_variant(run, "copy-nystrom", progress=False, device="cpu")
    assert launched == ["source", "copy-nystrom"]
    assert (run.out / "models" / "copy-nystrom" / "config.json").is_file()
    train_variant(run, "copy-nystrom", progress=False, device="cpu")  # finished: nothing to do
    train_variant(run, "hier0.4-nystrom", progress=False, device="cpu")  # the source's weights are back
    assert launched == ["source", "copy-nystrom", "hier0.4-nystrom"]


def test_screen_and_report_end_to_end(tiny_source):
    run = tiny_source
    variants = ("copy-block512", "copy-nystrom", "hier0.4-local-nystrom", "interpolate-softmax")
    step0 = screen(run, variants, progress=False)
    assert list(step0) == [
        SOURCE_WINDOWS,
        "copy-nystrom",
        "copy-block512",
        "interpolate-softmax",
        "hier0.4-local-nystrom",
    ]
    for v in step0.values():
        assert list(v["mlm_acc_by_bucket"]) == ["[0, 512)", "[512, 1024)"]
        assert 0.0 <= v["mlm_acc"] <= 1.0 and v["mlm_loss"] > 0
    stamp = (run.out / "screen" / "copy-nystrom.json").stat().st_mtime_ns
    assert screen(run, variants, progress=False) == step0  # finished entries are read back, not recomputed
    assert (run.out / "screen" / "copy-nystrom.json").stat().st_mtime_ns == stamp
    report = write_report(run, probes=False)
    assert set(report["step0"]) == set(step0) and report["variants"] == {}
    saved = json.loads((run.out / "results.json").read_text())
    assert saved["step0"]["copy-nystrom"]["mlm_acc"] == step0["copy-nystrom"]["mlm_acc"]
    md = (run.out / "results.md").read_text()
    assert "| copy-block512 |" in md and "[0, 512) vs source" in md


def test_genre_stage_picks_the_best_finished_long_nystrom_model_and_reports_per_seed(tmp_path):
    from nystrom_lab.long_context.genre import run_dir
    from nystrom_lab.long_context.positions_genre import best_long, run_genre, setups

    run = PositionsRun(corpus=("c",), out=tmp_path)
    with pytest.raises(FileNotFoundError, match="no long Nyström variant has finished"):
        best_long(run)
    variants = {"source": {"final_mlm_acc": 0.9, "finished": True}, CONTINUED: {"final_mlm_acc": 0.8, "finished": True},
                "copy-softmax": {"final_mlm_acc": 0.7, "finished": True},
                "hier0.4-nystrom": {"final_mlm_acc": 0.6, "finished": False},
                "copy-nystrom": {"final_mlm_acc": 0.3, "finished": True},
                "interpolate-local-nystrom": {"final_mlm_acc": 0.4, "finished": True}}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps({"variants": variants}))
    best = best_long(run)
    assert best == "interpolate-local-nystrom"
    assert setups(best) == {CONTINUED: (CONTINUED, 512), best: (best, 4096), f"{best}-first512": (best, 512)}
    genres = tmp_path / "genres"
    genres.mkdir()
    labels = ["press", "fiction", "fiction", "learned"]
    (genres / "test.csv").write_text(
        "file,label,text\n" + "".join(f"c{i},{lab},x\n" for i, lab in enumerate(labels))
    )
    preds = {CONTINUED: ["fiction"] * 4, best: labels}
    for seed in (0, 1):
        for name, p in preds.items():
            folder = run_dir(tmp_path, name, seed)
            folder.mkdir(parents=True)
            (folder / "predictions_test.tsv").write_text(
                "index\tprediction\n" + "".join(f"{i}\t{x}\n" for i, x in enumerate(p))
            )
            (folder / "finetune_results.json").write_text(json.dumps(
                {"test": {"macro_f1": 0.5}, "validation": {"accuracy": 0.6}, "loop": {"best_step": 3}}))  # fmt: skip
    genre = run_genre(run, genres, seeds=(0, 1), train=False)
    assert set(genre) == {CONTINUED, best}  # first512 runs not fine-tuned here
    assert genre[best]["test_acc"] == [1.0, 1.0] and genre[CONTINUED]["test_acc"] == [0.5, 0.5]
    assert genre[best]["press_recall"] == [1.0, 1.0] and genre[CONTINUED]["press_recall"] == [0.0, 0.0]
    assert genre[best]["vs_window_512"][0]["accuracy_difference"] == 0.5
    # regression: write_report took genre= and dropped it, so results.json never held the genre stage
    write_report(run, probes=False, genre=genre)
    write_report(run, probes=False)  # a later report keeps it
    assert json.loads((tmp_path / "results.json").read_text())["genre"][best]["test_acc"] == [1.0, 1.0]


def _curve(steps: list[int], accs: list[float], buckets: dict[str, float]) -> dict:
    return {"finished": True, "curves": {"step": steps, "mlm_acc": accs}, "final_mlm_acc": accs[-1],
            "mlm_acc_by_bucket": buckets, "tokens_seen": steps[-1] * 1000}  # fmt: skip


def test_targets_compare_each_long_nystrom_variant_with_the_window_baseline_and_extrapolate_the_gap():
    steps = [0, 100, 1000, 10000]
    base = _curve(steps, [0.20, 0.25, 0.30, 0.33], {"[0, 512)": 0.34, "[512, 1024)": 0.32})
    # the gap -3, -2, -1 points at 1e5, 1e6, 1e7 tokens: +1 point per 10x, parity at 1e8
    long = _curve(steps, [0.19, 0.22, 0.28, 0.32], {"[0, 512)": 0.335, "[512, 1024)": 0.305})
    step0 = {SOURCE_WINDOWS: {"mlm_acc_by_bucket": {"[0, 512)": 0.30, "[512, 1024)": 0.29}},
             "copy-local-nystrom": {"mlm_acc_by_bucket": {"[0, 512)": 0.275, "[512, 1024)": 0.1}}}  # fmt: skip
    report = {"settings": {"tokens_per_step": 1000}, "step0": step0,
              "variants": {CONTINUED: base, "copy-local-nystrom": long, "copy-softmax": long}}  # fmt: skip
    found = targets(report)
    assert list(found) == ["copy-local-nystrom"]  # softmax is not a long Nyström variant
    e = found["copy-local-nystrom"]
    assert e["gap_points"] == pytest.approx(-1.0) and not e["mlm_met"]
    assert e["gap_points_by_bucket"] == pytest.approx({"[0, 512)": -0.5, "[512, 1024)": -1.5})
    assert e["step0_first_bucket_points"] == pytest.approx(-2.5) and not e["step0_met"]
    trend = e["trend"]
    assert trend["gap_points"] == pytest.approx([-3.0, -2.0, -1.0])
    assert trend["fit_points_per_decade"] == pytest.approx(1.0)
    assert trend["tokens_to_parity"] == pytest.approx(1e8, rel=1e-6)
    level = _curve(steps, [0.2, 0.25, 0.30, 0.33], {"[0, 512)": 0.335, "[512, 1024)": 0.315})
    met = targets({**report, "variants": {CONTINUED: base, "hier0.1-nystrom": level}})["hier0.1-nystrom"]
    assert met["mlm_met"] and "tokens_to_parity" not in met["trend"]
    row = "| copy-local-nystrom | 10.00 M | -1.00 | -1.50 in [512, 1024) | not met | -2.50 (not met) | +1.00 points"
    assert row in targets_table(found) and "≈ 100.0 M tokens" in targets_table(found)
    assert targets({**report, "variants": {"copy-local-nystrom": long}}) == {}  # no baseline yet
