"""The genre stage of the long-context experiment: its statistics against hand values, its report on
fake run folders, and its refusal to start without tables or pre-trained variants."""

from __future__ import annotations

import json

import pytest

from nystrom_lab.long_context.genre import (
    finetune_args,
    genre_report,
    mcnemar_exact,
    paired_bootstrap,
    run_dir,
    train_genre,
    wilson,
)


def test_wilson_interval_known_values():
    lo, hi = wilson(54, 93)  # 58.1 %
    assert lo == pytest.approx(0.4794, abs=1e-3) and hi == pytest.approx(0.6759, abs=1e-3)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)


def test_mcnemar_exact_by_hand():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)  # all 5 discordant one way: 2 · 0.5⁵
    assert mcnemar_exact(3, 1) == pytest.approx(2 * 5 / 16)  # P(X ≤ 1 | n = 4) = 5/16
    assert mcnemar_exact(1, 3) == mcnemar_exact(3, 1)


def test_paired_bootstrap_brackets_the_difference():
    a = [True] * 60 + [False] * 40
    b = [True] * 50 + [False] * 50
    lo, hi = paired_bootstrap(a, b, samples=2000)
    assert lo < 0.10 < hi and lo > 0.0  # a is right on a superset of b's documents
    assert paired_bootstrap(a, a, samples=200) == (0.0, 0.0)


def test_report_on_fake_runs(tmp_path):
    genres = tmp_path / "genres"
    genres.mkdir()
    labels = ["press", "fiction", "fiction", "learned"]
    (genres / "test.csv").write_text("file,label,text\n" + "".join(f"c{i},{l},x\n" for i, l in enumerate(labels)))
    preds = {"window-512": ["press", "press", "fiction", "press"], "nystrom-4096": ["press", "fiction", "fiction", "learned"]}
    for name, p in preds.items():
        folder = run_dir(tmp_path, name, 0)
        folder.mkdir(parents=True)
        (folder / "predictions_test.tsv").write_text("index\tprediction\n" + "".join(f"{i}\t{x}\n" for i, x in enumerate(p)))
        (folder / "finetune_results.json").write_text(json.dumps(
            {"test": {"macro_f1": 0.5}, "validation": {"accuracy": 0.6}, "loop": {"best_step": 3}}))  # fmt: skip
    report = genre_report(tmp_path, genres)
    w, n = report["runs"]["window-512-seed0"], report["runs"]["nystrom-4096-seed0"]
    assert (w["test_accuracy"], n["test_accuracy"]) == (0.5, 1.0)
    assert n["recall_by_label"] == {"fiction": 1.0, "learned": 1.0, "press": 1.0}
    assert w["recall_by_label"]["fiction"] == 0.5
    vs = n["vs_window_512"]
    assert (vs["only_this_right"], vs["only_other_right"], vs["accuracy_difference"]) == (2, 0, 0.5)
    assert vs["mcnemar_p"] == pytest.approx(0.5)
    assert report["majority_accuracy"] == 0.5 and "nystrom-4096-first512-seed0" not in report["runs"]
    assert "| nystrom-4096-seed0 | 4096 | 100.0 %" in (tmp_path / "genre" / "results.md").read_text()


def test_refuses_without_tables_or_pretrained_variants(tmp_path):
    with pytest.raises(FileNotFoundError, match="nystrom data brown DIR --genres"):
        train_genre(tmp_path, tmp_path / "genres")
    genres = tmp_path / "genres"
    genres.mkdir()
    for s in ("train", "validation", "test"):
        (genres / f"{s}.csv").write_text("label,text\na,b\n")
    with pytest.raises(FileNotFoundError, match="has not finished pre-training"):
        train_genre(tmp_path, genres)
    args = finetune_args(tmp_path, genres, "nystrom-4096-first512", 1)
    assert args[args.index("--init-from") + 1] == str(tmp_path / "nystrom-4096")
    assert args[args.index("--max-length") + 1] == "512"
