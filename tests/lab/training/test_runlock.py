"""Run folders (#15): one run per folder (lock with pid and host, stale locks taken over), the run record,
and the empty-split guard that runs before training starts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import transformers

import nystrom
from lab.training.toy_task import config, make_task
from nystrom_lab.cli import main
from nystrom_lab.training import train
from nystrom_lab.training.runlock import LOCK_NAME, RECORD_NAME, RunFolderInUseError, hold_run_folder

ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p),
    "OMP_NUM_THREADS": "1",
}
HOLD = (
    "import sys\nfrom nystrom_lab.training.runlock import hold_run_folder\n"
    "with hold_run_folder(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n"
)


class Holder:
    """Another process holding ``folder`` (as a running ``nystrom`` command would) until ``stop()``."""

    def __init__(self, folder: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(folder)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV, text=True,
        )  # fmt: skip
        assert self.proc.stdout.readline().strip() == "held"

    def stop(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------- two runs, one folder
def test_a_second_run_into_a_folder_in_use_refuses_naming_folder_and_holder(tmp_path):
    holder = Holder(tmp_path)
    try:
        with pytest.raises(RunFolderInUseError) as info:
            train(make_task(), config(steps=4), tmp_path, progress=False)
        msg = str(info.value)
        assert str(tmp_path) in msg and f"pid {holder.proc.pid} on host {socket.gethostname()}" in msg
        assert info.value.holder["pid"] == holder.proc.pid
        assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "last").exists()
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == holder.proc.pid  # left alone
    finally:
        holder.stop()
    assert not (tmp_path / LOCK_NAME).exists()  # the holder released it
    res = train(make_task(), config(steps=4), tmp_path, progress=False)  # now the folder is free
    assert res["step"] == 4


def test_the_cli_refuses_at_once_before_generating_data(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NYSTROM_DEBUG", raising=False)
    holder = Holder(tmp_path)
    try:
        argv = ["lra", "listops", "--preset", "quick", "--listops-sizes", "20,5,5", "--out", str(tmp_path)]
        assert main(argv) == 1
    finally:
        holder.stop()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"nystrom: error: run folder {tmp_path} is in use by pid {holder.proc.pid}")
    assert err[1] == "hint: wait for that run to finish, or give another --out" and len(err) == 2
    assert not (tmp_path / "data").exists()  # refused before the ListOps generation


def test_another_thread_of_the_process_is_refused_and_nesting_is_allowed(tmp_path):
    errors: list[BaseException] = []

    def other() -> None:
        try:
            with hold_run_folder(tmp_path):
                pass
        except BaseException as err:
            errors.append(err)

    with hold_run_folder(tmp_path):
        with hold_run_folder(tmp_path / "." / ""):  # re-entrant: a command locks, then the loop again
            assert (tmp_path / LOCK_NAME).exists()
        assert (tmp_path / LOCK_NAME).exists()  # the inner exit does not release
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert len(errors) == 1 and isinstance(errors[0], RunFolderInUseError)
    assert "another thread" in str(errors[0])
    assert not (tmp_path / LOCK_NAME).exists()


# ---------------------------------------------------------------- stale locks
def test_a_stale_lock_of_a_dead_pid_is_taken_over_with_a_warning(tmp_path):
    pid = _dead_pid()
    lock = {"pid": pid, "host": socket.gethostname(), "started": "earlier", "command": ["nystrom", "x"]}
    (tmp_path / LOCK_NAME).write_text(json.dumps(lock))
    with pytest.warns(UserWarning, match=rf"stale lock of pid {pid} on {socket.gethostname()}"):
        res = train(make_task(), config(steps=4), tmp_path, progress=False)
    assert res["step"] == 4 and not (tmp_path / LOCK_NAME).exists()


def test_a_lock_of_a_live_pid_or_another_host_is_not_taken_over(tmp_path):
    lock_path = tmp_path / LOCK_NAME
    for holder, reason in (
        ({"pid": 1, "host": socket.gethostname()}, "that process is alive"),  # init: alive, never ours
        ({"pid": 4242, "host": "elsewhere.example"}, "another host cannot be checked"),
    ):
        lock_path.write_text(json.dumps({**holder, "started": "then", "command": ["nystrom", "lra"]}))
        with pytest.raises(RunFolderInUseError, match=reason) as info:
            with hold_run_folder(tmp_path):
                pass
        assert f"pid {holder['pid']} on host {holder['host']}" in str(info.value)
        assert f"delete {lock_path}" in str(info.value)
        assert json.loads(lock_path.read_text())["pid"] == holder["pid"]  # untouched


def test_a_killed_run_leaves_a_stale_lock_that_the_same_command_takes_over(tmp_path):
    toy = str(Path(__file__).parent / "toy_task.py")
    killed = subprocess.run(
        [sys.executable, toy, str(tmp_path), "--kill-at", "3"], env=ENV, capture_output=True
    )
    assert killed.returncode == -9 and (tmp_path / LOCK_NAME).exists()
    done = subprocess.run([sys.executable, toy, str(tmp_path)], env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "taking over the stale lock" in done.stderr and not (tmp_path / LOCK_NAME).exists()


# ---------------------------------------------------------------- release
def test_the_lock_is_released_after_a_finished_run_and_after_an_exception(tmp_path):
    train(make_task(), config(steps=4), tmp_path / "ok", progress=False)
    assert not (tmp_path / "ok" / LOCK_NAME).exists()
    task = make_task()

    def failing_step(model, batch):
        raise RuntimeError("boom")

    task.step = failing_step
    with pytest.raises(RuntimeError, match="boom"):
        train(task, config(steps=4), tmp_path / "bad", progress=False)
    assert not (tmp_path / "bad" / LOCK_NAME).exists()
    with hold_run_folder(tmp_path / "bad"):  # and anyone can take it again
        pass


def test_only_rank_zero_locks_under_torchrun(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with hold_run_folder(tmp_path):
        assert not (tmp_path / LOCK_NAME).exists()
    monkeypatch.setenv("RANK", "0")
    with hold_run_folder(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


# ---------------------------------------------------------------- the run record
def test_the_run_record_holds_configuration_seed_versions_and_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["nystrom", "toy", "--seed", "7"])
    cfg = config(steps=4, seed=7)
    train(make_task(), cfg, tmp_path, progress=False, stop_after=2)
    rec = json.loads((tmp_path / RECORD_NAME).read_text())
    assert rec["command"] == ["nystrom", "toy", "--seed", "7"] and rec["seed"] == 7
    assert rec["train_config"] == json.loads(cfg.to_json())
    assert rec["versions"] == {
        "nystrom": nystrom.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }
    assert rec["examples"] == {"train": 96, "dev": 32, "test": 32} and rec["task"] == "toy"
    assert rec["host"] == socket.gethostname() and rec["pid"] == os.getpid() and rec["previous"] == []
    monkeypatch.setattr(sys, "argv", ["nystrom", "toy", "--resume"])
    train(make_task(), cfg, tmp_path, progress=False)  # resumed: a new start, the first one kept
    rec = json.loads((tmp_path / RECORD_NAME).read_text())
    assert rec["command"] == ["nystrom", "toy", "--resume"]
    assert [p["command"] for p in rec["previous"]] == [["nystrom", "toy", "--seed", "7"]]


def test_the_run_record_of_a_model_with_a_config_holds_it(tmp_path):
    from nystrom_lab.lra.experiment import LRARun, train_config
    from nystrom_lab.lra.experiment import make_task as lra_task

    run = LRARun(
        task="listops", preset="quick", listops_sizes=(12, 4, 4), steps=2, batch_size=4, out=tmp_path
    )
    task = lra_task(run, tmp_path)
    train(task, train_config(run), tmp_path, progress=False)
    rec = json.loads((tmp_path / RECORD_NAME).read_text())
    assert rec["model_config"]["attention"] == {"name": "nystrom", "conv_kernel_size": 35}  # LRA's preset
    assert task.model.config.attention == rec["model_config"]["attention"]
    assert rec["model_class"].endswith("NystromformerForSequenceClassification")


def test_under_torchrun_a_refused_rank_0_stops_the_run(tmp_path, free_port):
    """Rank 0 holds the one lock of a torchrun run (test_training's DDP test: the lock is released and
    run.json says world_size 2); when it is refused, torchrun stops the other rank too."""
    toy = str(Path(__file__).parent / "toy_task.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port}"]
    holder = Holder(tmp_path / "held")
    try:
        refused = subprocess.run([*cmd, toy, str(tmp_path / "held")], env=ENV, capture_output=True, text=True)
    finally:
        holder.stop()
    assert refused.returncode != 0 and f"is in use by pid {holder.proc.pid}" in refused.stderr
    assert not (tmp_path / "held" / "metrics.jsonl").exists()
