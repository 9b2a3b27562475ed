"""CUDA paths of the training loop: a training step, exact resume with the device RNG, NCCL.

Marker ``gpu``: skipped on machines without CUDA (conftest.py). Run them with ``pytest -m gpu`` (or
``scripts/gpu_check.sh``): all passed on an H100 on 2026-11-26, the two-GPU test skipped (one GPU).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lab.training.toy_task import ToyModel, config, make_task
from nystrom_lab.training import train
from nystrom_lab.training.checkpoint import load_checkpoint

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_training_step_on_cuda(tmp_path, precision):
    task = make_task()
    res = train(
        task, config(steps=30, eval_every=10, device="cuda", precision=precision), tmp_path, progress=False
    )
    assert next(task.model.parameters()).device.type == "cuda"
    assert res["best_dev"] > 0.6
    state, _, rng = load_checkpoint(tmp_path / "last", model=ToyModel())  # a GPU checkpoint loads on the CPU
    assert rng["device_type"] == "cuda" and ("scaler" in state) == (precision == "fp16")


def test_resumed_cuda_run_equals_uninterrupted_run_with_dropout(tmp_path):
    """Dropout draws from the CUDA generator: equal weights need its state restored on resume."""
    train(make_task(), config(device="cuda"), tmp_path / "ref", progress=False)
    train(make_task(), config(device="cuda"), tmp_path / "run", progress=False, stop_after=7)
    train(make_task(), config(device="cuda"), tmp_path / "run", progress=False)
    a, b = (load_file(str(tmp_path / d / "last" / "model.safetensors")) for d in ("ref", "run"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cuda_checkpoint_resumes_on_the_cpu(tmp_path):
    train(make_task(), config(steps=6, device="cuda"), tmp_path, progress=False, stop_after=3)
    assert train(make_task(), config(steps=6, device="cpu"), tmp_path, progress=False)["step"] == 6


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_two_gpus_equals_one_gpu(tmp_path, free_port):
    env = {
        "PYTHONPATH": f"{Path(__file__).parent}:{Path(__file__).parents[3] / 'src'}",
        "PATH": "/usr/bin:/bin",
    }
    toy = str(Path(__file__).parent / "toy_task.py")
    subprocess.run(
        [sys.executable, toy, str(tmp_path / "one"), "--no-dropout", "--device", "cuda"], check=True, env=env
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port}",
        toy,
    ]
    subprocess.run([*cmd, str(tmp_path / "two"), "--no-dropout", "--device", "cuda"], check=True, env=env)
    a, b = (load_file(str(tmp_path / d / "last" / "model.safetensors")) for d in ("one", "two"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    assert json.loads((tmp_path / "two" / "results.json").read_text())["step"] == 12
