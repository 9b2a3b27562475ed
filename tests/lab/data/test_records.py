"""The one reader per record kind (:mod:`nystrom_lab.data.records`): the training log and its median step
time, a run's options as JSON (the long-context experiments' committed settings load and write back
unchanged), and the machine and versions a record names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nystrom_lab.data.records import (
    environment,
    median_step_s,
    options_from_record,
    options_record,
    read_metrics,
)
from nystrom_lab.long_context.experiment import LongContextRun
from nystrom_lab.long_context.positions import PositionsRun

ROOT = Path(__file__).resolve().parents[3]


def test_read_metrics_skips_blank_lines_and_may_miss(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "split": "train"}\n\n  \n{"step": 2, "split": "dev"}\n')
    assert [r["step"] for r in read_metrics(log)] == [1, 2]
    assert read_metrics(tmp_path / "none.jsonl", missing_ok=True) == []
    with pytest.raises(FileNotFoundError):
        read_metrics(tmp_path / "none.jsonl")


def test_median_step_s_ignores_pauses_and_resumed_clocks():
    recs = [
        {"step": 10, "time": 2.0}, {"step": 20, "time": 4.0}, {"step": 30, "time": 6.0},
        {"step": 40, "time": 300.0},  # suspended for minutes
        {"step": 50, "time": 302.0},
        {"step": 60, "time": 1.9}, {"step": 70, "time": 3.9},  # resumed: the clock restarts
    ]  # fmt: skip
    assert median_step_s(recs) == pytest.approx(0.2)
    assert median_step_s(recs[:1]) is None


def test_median_step_s_leaves_out_the_intervals_holding_an_evaluation():
    recs = [{"step": s, "time": t} for s, t in ((10, 1.0), (20, 2.0), (30, 9.0), (40, 16.0), (50, 17.0))]
    assert median_step_s(recs) == pytest.approx(0.4)
    # evaluations after steps 20 and 30 land in the intervals (20, 30] and (30, 40]
    assert median_step_s(recs, eval_steps={20, 30}) == pytest.approx(0.1)
    assert median_step_s(recs[1:3], eval_steps={20}) is None


@pytest.mark.parametrize(
    "cls,folder",
    [(LongContextRun, "experiments/long-context"), (PositionsRun, "experiments/long-context/positions")],
)
def test_committed_settings_load_and_write_back_unchanged(cls, folder, tmp_path):
    text = (ROOT / folder / "settings.json").read_text()
    run = cls.from_record(json.loads(text))
    assert isinstance(run.out, Path) and isinstance(run.corpus, tuple)
    assert json.loads(json.dumps(run.record())) == json.loads(text)
    moved = cls.from_record({**run.record(), "out": str(tmp_path)})
    moved.write_settings()
    assert (tmp_path / "settings.json").read_text() == text.replace(f'"{folder}"', json.dumps(str(tmp_path)))


def test_options_round_trip_nested_tuples_and_optional_paths():
    from nystrom_lab.text.pretrain_run import PretrainRun

    run = PretrainRun(corpus=("a.txt",), out=Path("o"), tokenizer=Path("t.json"), lr_scale=(("*pos*", 10.0),))
    again = options_from_record(PretrainRun, json.loads(json.dumps(options_record(run))))
    assert again == run and isinstance(again.tokenizer, Path)


def test_the_long_context_experiments_share_one_run_class():
    plain, positions = LongContextRun(corpus=("c",)), PositionsRun(corpus=("c",))
    for run, variant in ((plain, "nystrom-4096"), (positions, "copy-nystrom")):
        args = run.pretrain_args(variant, device="cpu")
        assert args[args.index("--device") + 1] == "cpu" and args[args.index("--max-length") + 1] == "4096"
        assert run.from_record(run.record()) == run


def test_environment_names_the_machine_and_the_versions():
    import torch

    env = environment("transformers", "no_such_package_here")
    assert env["threads"] == torch.get_num_threads() and env["torch"] == torch.__version__
    assert env["python"] == sys.version.split()[0] and env["no_such_package_here"] is None
    assert env["cpu"] and env["transformers"]


def test_records_load_without_torch():
    code = "import sys, nystrom_lab.data.records, nystrom_lab.text.curves; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
