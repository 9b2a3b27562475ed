"""CUDA paths: the fused attention kernels on a GPU, a training step, exact resume with the device RNG.

Marker ``gpu``: skipped on machines without CUDA (conftest.py). Run them with ``pytest -m gpu`` (or
``scripts/gpu_check.sh``): all passed on an H100 on 2026-11-26, the two-GPU test skipped (one GPU).
"""

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nystrom.functional import nystrom_attention, softmax_attention
from nystrom_lab.training import train
from nystrom_lab.training.checkpoint import load_checkpoint
from toy_task import ToyModel, config, make_task

from oracle import nystrom_oracle, rel_err, right_pad_mask, softmax_oracle

pytestmark = pytest.mark.gpu

#: relative error bounds against float64, about 4x the same tests' CPU errors (fp32 / bf16 / fp16):
#: iterative Nyström 5.5e-7 / 5.0e-3 / 6.6e-4, SDPA 2.0e-7 / 2.1e-3 / 2.6e-4, m = n exact pinv 6.0e-5 / 4.3e-3 / 4.7e-4
TOL_NYSTROM = {torch.float32: 5e-6, torch.bfloat16: 2e-2, torch.float16: 3e-3}
TOL_SDPA = {torch.float32: 5e-6, torch.bfloat16: 1e-2, torch.float16: 1.5e-3}
TOL_EXACT = {torch.float32: 3e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _mask_kw(fn) -> str:
    params = inspect.signature(fn).parameters
    return "mask" if "mask" in params else "key_padding_mask"


def _qkv(dtype, b=2, h=4, n=96, d=32):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(dtype) for _ in range(3))  # rounded once
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_nystrom_on_cuda_with_padding_matches_the_float64_oracle(dtype):
    q, k, v = _qkv(dtype)
    mask = right_pad_mask([96, 61], 96)
    cuda = [t.cuda() for t in (q, k, v)]
    out = nystrom_attention(*cuda, num_landmarks=16, **{_mask_kw(nystrom_attention): mask.cuda()}).cpu()
    ref = nystrom_oracle(q, k, v, 16, mask=mask, pinv="iterative")
    assert out.dtype == dtype and torch.isfinite(out).all()
    real = mask[:, None, :, None].expand_as(ref)
    assert rel_err(out[real], ref[real]) < TOL_NYSTROM[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_m_equals_n_on_cuda_is_softmax_and_equals_sdpa(dtype):
    q, k, v = _qkv(dtype, n=48)
    mask = right_pad_mask([48, 30], 48)
    cuda = [t.cuda() for t in (q, k, v)]
    out = nystrom_attention(
        *cuda, num_landmarks=48, pinv="exact", **{_mask_kw(nystrom_attention): mask.cuda()}
    )
    exact = softmax_attention(*cuda, **{_mask_kw(softmax_attention): mask.cuda()})
    ref = softmax_oracle(q, k, v, mask)
    real = mask[:, None, :, None].expand_as(ref)
    assert rel_err(exact.cpu()[real], ref[real]) < TOL_SDPA[dtype]
    assert rel_err(out.cpu()[real], ref[real]) < TOL_EXACT[dtype]


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
        "PYTHONPATH": f"{Path(__file__).parent}:{Path(__file__).parents[1] / 'src'}",
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
