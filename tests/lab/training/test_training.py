"""The shared training loop: schedule, learning, exact resume after kill -9, DDP = 1 process, accumulation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lab.training.toy_task import config, make_task
from nystrom_lab.data.records import read_metrics
from nystrom_lab.training import TrainConfig, global_batch, linear_warmup_decay, train

TOY = str(Path(__file__).parent / "toy_task.py")
# tests/ first, then the caller's PYTHONPATH: a checkout run with PYTHONPATH=src tests its own package
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p),
    "OMP_NUM_THREADS": "1",
}


def _weights(out: Path) -> dict:
    return load_file(str(out / "last" / "model.safetensors"))


def test_schedule_is_linear_warmup_then_linear_decay():
    vals = [linear_warmup_decay(s, warmup=4, total=12) for s in range(12)]
    assert vals[:4] == [0.25, 0.5, 0.75, 1.0]
    assert vals[4] == 1.0 and vals[8] == 0.5 and vals[11] == pytest.approx(0.125)


def test_global_batches_are_a_pure_function_covering_each_epoch():
    b = [global_batch(10, s, 4, seed=3) for s in range(5)]  # 20 examples = 2 epochs
    flat = [i for batch in b for i in batch]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert global_batch(10, 3, 4, seed=3) == b[3]
    assert global_batch(10, 3, 4, seed=4) != b[3]


def test_loss_falls_and_outputs_are_written(tmp_path):
    res = train(make_task(), config(steps=40, eval_every=10), tmp_path, progress=False)
    recs = read_metrics(tmp_path / "metrics.jsonl")
    train_loss = [r["loss"] for r in recs if r["split"] == "train"]
    assert sum(train_loss[-5:]) / 5 < 0.7 * sum(train_loss[:5]) / 5
    assert res["best_dev"] > 0.6 and res["test"]["accuracy"] > 0.6
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert json.loads((tmp_path / "results.json").read_text())["best_step"] == res["best_step"]


def test_a_fresh_run_in_a_folder_with_an_old_log_starts_the_log_afresh(tmp_path):
    # regression: a run restarted from scratch over a committed metrics.jsonl (weights are not committed)
    # kept the old step-0 line and logged a second one beside it
    old = [{"step": 0, "split": "dev", "accuracy": -1.0}, {"step": 3, "split": "train", "loss": -1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    train(make_task(), config(steps=4, eval_every=2, eval_at_start=True), tmp_path, progress=False)
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs if r["split"] == "dev"] == [0, 2, 4]
    assert all(r.get("accuracy", 0.0) >= 0 and r.get("loss", 0.0) >= 0 for r in recs)


def test_kill9_then_same_command_resumes_to_identical_weights(tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    subprocess.run([sys.executable, TOY, str(ref)], check=True, env=ENV, capture_output=True)
    killed = subprocess.run([sys.executable, TOY, str(run), "--kill-at", "7"], env=ENV, capture_output=True)
    assert killed.returncode == -9  # SIGKILL after 7 steps; last checkpoint at step 6
    assert json.loads((run / "last" / "meta.json").read_text())["step"] == 6
    subprocess.run([sys.executable, TOY, str(run)], check=True, env=ENV, capture_output=True)
    a, b = _weights(ref), _weights(run)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"]
    assert steps == list(range(1, 13))  # the killed run's step-7 line was dropped on resume


def test_ddp_two_processes_equals_one_process(tmp_path, free_port):
    # Dropout off: ranks draw different dropout masks by design, everything else must agree.
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run([sys.executable, TOY, str(one), "--no-dropout"], check=True, env=ENV, capture_output=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port}",
        TOY,
        str(two),
    ]
    proc = subprocess.run([*cmd, "--no-dropout"], env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = _weights(one), _weights(two)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), (k, float((a[k] - b[k]).abs().max()))
    d1 = read_metrics(one / "metrics.jsonl")
    d2 = read_metrics(two / "metrics.jsonl")
    assert [r["step"] for r in d1] == [r["step"] for r in d2]
    assert json.loads((two / "run.json").read_text())["world_size"] == 2  # one run record, one lock (rank 0)
    assert not (two / "run.lock").exists()


def test_grad_accumulation_equals_full_batch(tmp_path):
    t1, t2 = make_task(), make_task()
    t1, t2 = make_task(dropout=False), make_task(dropout=False)  # the two runs must agree to rounding
    train(t1, config(), tmp_path / "a", progress=False)
    train(t2, config(grad_accum=4), tmp_path / "b", progress=False)
    for p, q in zip(t1.model.parameters(), t2.model.parameters()):
        assert torch.allclose(p, q, atol=1e-5)


def test_resume_with_different_config_is_refused(tmp_path):
    train(make_task(), config(steps=6), tmp_path, progress=False, stop_after=3)
    with pytest.raises(ValueError, match="different configuration"):
        train(make_task(), config(steps=6, lr=1e-3), tmp_path, progress=False)


def test_config_validation():
    with pytest.raises(ValueError, match="divisible by grad_accum"):
        TrainConfig(steps=1, batch_size=10, grad_accum=3)
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0, batch_size=1)


def test_selection_metric_missing_from_dev_metrics_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="selection metric 'f1' is not among the dev metrics"):
        train(make_task(), config(metric="f1"), tmp_path, progress=False)


def test_derived_metrics_are_logged_and_select_the_best_step(tmp_path):
    task = make_task()
    task.derived = lambda means: {"error": 1.0 - means["accuracy"]}
    res = train(task, config(metric="error", metric_mode="min"), tmp_path, progress=False)
    devs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "dev"]
    assert all(r["error"] == pytest.approx(1 - r["accuracy"]) for r in devs)
    best = min(devs, key=lambda r: (r["error"], r["step"]))
    assert (res["best_dev"], res["best_step"]) == (best["error"], best["step"])
    assert res["test"]["error"] == pytest.approx(1 - res["test"]["accuracy"])
