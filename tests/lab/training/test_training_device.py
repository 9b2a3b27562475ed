"""The loop's device, precision and distributed code paths, as far as a CPU can run them.

CUDA-only behaviour (NCCL, the device RNG, bf16/fp16 on a GPU) is in tests/lab/training/test_cuda_training.py (marker ``gpu``).
"""

import sys

import pytest
import torch
from safetensors.torch import load_file

from lab.training.toy_task import ToyModel, config, make_task
from nystrom_lab.argtypes import device_options
from nystrom_lab.data.records import read_metrics
from nystrom_lab.training import train
from nystrom_lab.training.checkpoint import load_checkpoint, rng_state, set_rng_state
from nystrom_lab.training.device import autocast, init_distributed, resolve_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@no_cuda
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "auto-under-cuda"])
def test_cuda_without_cuda_is_a_clear_error_not_a_cpu_fallback(tmp_path, spec):
    if spec == "auto-under-cuda":
        assert resolve_device("auto") == torch.device("cpu")  # auto means "CUDA when available"
        return
    with pytest.raises(ValueError, match=rf"--device {spec}: CUDA is not available .* use --device cpu"):
        train(make_task(), config(device=spec), tmp_path, progress=False)
    assert not (tmp_path / "last").exists()


@pytest.mark.parametrize("spec", ["gpu", "cpu:1", "cuda:x", "", "CUDA"])
def test_malformed_device_strings_are_refused(spec):
    with pytest.raises(ValueError, match="--device must be auto, cpu, cuda, cuda:N or mps"):
        resolve_device(spec)


def test_explicit_gpu_index_under_torchrun_is_refused(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="each process uses cuda:LOCAL_RANK; pass --device cuda"):
        resolve_device("cuda:1", local_rank=0)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="LOCAL_RANK 5 has no GPU"):
        resolve_device("auto", local_rank=5)


def test_distributed_backend_is_nccl_on_cuda_and_gloo_on_cpu(monkeypatch):
    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend: calls.append(backend))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    assert init_distributed("cpu") == (1, 2, torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(d))
    assert init_distributed("auto") == (1, 2, torch.device("cuda", 1))
    assert calls == ["gloo", torch.device("cuda", 1), "nccl"]


def test_device_options_keep_bf16_as_a_deprecated_alias():
    ns = type("A", (), {"device": "cpu", "precision": None, "bf16": True, "compile": False})()
    with pytest.warns(FutureWarning, match="--precision bf16"):
        assert device_options(ns) == {"device": "cpu", "precision": "bf16", "compile": False}
    ns.precision = "fp16"
    with pytest.raises(ValueError, match="--bf16 contradicts --precision fp16"):
        device_options(ns)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_and_fp16_checkpoints_its_grad_scaler(tmp_path, precision):
    res = train(make_task(), config(steps=40, eval_every=10, precision=precision), tmp_path, progress=False)
    assert res["best_dev"] > 0.6
    losses = [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])
    state, _, _ = load_checkpoint(tmp_path / "last", model=ToyModel())
    if precision == "fp16":
        assert state["scaler"]["scale"] > 0 and "_growth_tracker" in state["scaler"]
    else:
        assert "scaler" not in state  # bf16 needs no loss scaling


def test_autocast_follows_the_precision():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with autocast(torch.device("cpu"), precision):
            assert (x @ w).dtype == dtype


def test_fp16_resume_equals_uninterrupted_run(tmp_path):
    ref = make_task(dropout=False)
    train(ref, config(precision="fp16"), tmp_path / "ref", progress=False)
    train(make_task(dropout=False), config(precision="fp16"), tmp_path / "run", progress=False, stop_after=7)
    train(make_task(dropout=False), config(precision="fp16"), tmp_path / "run", progress=False)
    a, b = (load_file(str(tmp_path / d / "last" / "model.safetensors")) for d in ("ref", "run"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_may_resume_on_another_device_setting_but_not_another_precision(tmp_path):
    train(make_task(), config(steps=6, device="cpu"), tmp_path, progress=False, stop_after=3)
    train(make_task(), config(steps=6, device="auto"), tmp_path, progress=False)  # device: runtime only
    with pytest.raises(ValueError, match="different configuration"):
        train(make_task(), config(steps=9, precision="bf16"), tmp_path, progress=False)


def test_a_checkpoint_from_before_precision_existed_still_resumes(tmp_path):
    import json

    train(make_task(), config(steps=6), tmp_path, progress=False, stop_after=3)
    meta = json.loads((tmp_path / "last" / "meta.json").read_text())
    meta["config"].pop("precision"), meta["config"].pop("device"), meta["config"].pop("compile")
    meta["config"]["bf16"] = False
    (tmp_path / "last" / "meta.json").write_text(json.dumps(meta))
    assert train(make_task(), config(steps=6), tmp_path, progress=False)["step"] == 6


def test_rng_state_round_trip_keeps_device_state_only_for_its_device_type():
    state = rng_state(torch.device("cpu"))
    assert "device" not in state  # the CPU generator is the "torch" entry
    a = torch.rand(3)
    set_rng_state(state, torch.device("cpu"))
    assert torch.equal(torch.rand(3), a)
    foreign = {**state, "device_type": "cuda", "device": torch.zeros(8, dtype=torch.uint8)}
    set_rng_state(foreign, torch.device("cpu"))  # a CUDA run resumed on the CPU: device part ignored
    assert torch.equal(torch.rand(3), a)


def _nan_after(task, bad_step: int):
    """Make ``task``'s loss NaN from training step ``bad_step`` (1-based) on, and make its forward
    refuse NaN weights as attention does ("NaN in q or k")."""
    inner, calls = task.step, {"n": 0}

    def step(model, batch):
        if model.training:
            calls["n"] += 1
            if any(torch.isnan(p).any() for p in model.parameters()):
                raise RuntimeError("NaN in q or k")
        loss, metrics = inner(model, batch)
        return (loss * float("nan") if model.training and calls["n"] >= bad_step else loss), metrics

    task.step = step
    return task


def test_non_finite_loss_is_reported_with_step_and_learning_rate(tmp_path):
    task = _nan_after(make_task(), 5)
    cfg = config(steps=12, log_every=10, checkpoint_every=10, eval_every=10, warmup=0, lr=0.03)
    with pytest.raises(
        FloatingPointError, match=r"non-finite training loss at step 5 \(learning rate 0\.0[0-9]+\)"
    ):
        train(task, cfg, tmp_path, progress=False)
    assert not (tmp_path / "last").exists()  # diverged weights are never checkpointed


def test_the_loops_message_comes_before_the_models_complaint(tmp_path):
    task = _nan_after(make_task(), 3)
    cfg = config(steps=12, log_every=12, checkpoint_every=12, eval_every=12, clip=None)
    with pytest.raises(FloatingPointError, match="at step 3") as info:
        train(task, cfg, tmp_path, progress=False)
    assert "NaN in q or k" in str(info.value.__cause__)


def test_no_host_sync_between_logging_intervals(tmp_path, monkeypatch):
    """The loop and the step read no device value on the host except when logging, evaluating or
    checkpointing (on a GPU each read would stall the pipeline)."""
    reads = []

    def counting(name):
        orig = getattr(torch.Tensor, name)

        def wrapper(self, *a, **k):
            code = sys._getframe(1).f_code
            host_only = code.co_name in ("global_batch", "_count_tokens")  # CPU index/batch data by design
            if ("nystrom" in code.co_filename or "toy_task" in code.co_filename) and not host_only:
                reads.append((name, code.co_filename.rsplit("/", 1)[-1], code.co_name))
            return orig(self, *a, **k)

        return wrapper

    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    task = make_task()
    task.dev = task.test = None
    train(task, config(steps=40, log_every=20, checkpoint_every=40), tmp_path, progress=False)
    loop_reads = [r for r in reads if r[1] in ("loop.py", "watch.py", "toy_task.py")]
    assert len(loop_reads) <= 2 * 5, loop_reads  # per log (2): the non-finite flag, loss, grad norm


def test_compile_runs_the_training_forward_compiled_and_saves_plain_weights(tmp_path, monkeypatch):
    compiled = []
    real = torch.compile

    def eager_compile(model, **kw):  # Dynamo's real graph capture without a C++ toolchain
        compiled.append(type(model).__name__)
        return real(model, backend="eager")

    monkeypatch.setattr(torch, "compile", eager_compile)
    train(make_task(dropout=False), config(steps=6, compile=True), tmp_path / "c", progress=False)
    train(make_task(dropout=False), config(steps=6), tmp_path / "r", progress=False)
    assert compiled == ["ToyModel"]
    a, b = (load_file(str(tmp_path / d / "last" / "model.safetensors")) for d in ("c", "r"))
    assert a.keys() == b.keys()  # no "_orig_mod." prefixes
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
