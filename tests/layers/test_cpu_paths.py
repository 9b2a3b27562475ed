"""Every CPU, every dtype: the oneDNN fast path is taken only where this CPU's oneDNN runs the dtype.

Regression for bf16 on AVX2-only CPUs: on CPUs without AVX-512 (AVX2-only AMD EPYC, laptops), oneDNN has no bf16 inner
product, and a bf16 ``NystromAttention`` or model crashed in ``layers/dense.py`` ("could not create a
primitive descriptor for the inner product forward propagation primitive"). A child process limited to AVX2
(``ONEDNN_MAX_CPU_ISA=AVX2``, ``ATEN_CPU_CAPABILITY=avx2``) runs what such a CPU runs, on any x86 machine.
"""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import nystrom.layers.onednn as O
from nystrom.layers.dense import dense, fuses

X86 = platform.machine().lower() in ("x86_64", "amd64")
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
# largest |difference| of real outputs from float32, per dtype (bf16 keeps 8 bits of mantissa, fp16 11)
TOL = {"float32": 1e-5, "bfloat16": 3e-2, "float16": 4e-3}


@pytest.fixture(scope="module")
def avx2_run():
    env = {**os.environ, **AVX2_ENV}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("isa_worker.py"))],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.skipif(not X86, reason="ONEDNN_MAX_CPU_ISA=AVX2 names an x86 ISA")
def test_avx2_limit_is_detected_and_matches_torch(avx2_run):
    assert avx2_run["cpu_capability"] == "AVX2"
    assert avx2_run["fp32_fused"] is O.built_with_linear()
    assert avx2_run["bf16_fused"] is False  # no bf16 inner product below AVX-512 / AVX2-VNNI-2
    assert avx2_run["bf16_compute"] == ("torch.float32" if O.built_with_linear() else "None")
    assert avx2_run["torch_bf16_flag"] is False


@pytest.mark.skipif(not X86, reason="ONEDNN_MAX_CPU_ISA=AVX2 names an x86 ISA")
def test_avx2_every_dtype_runs_module_and_model_in_inference_and_training(avx2_run):
    cases = avx2_run["cases"]
    assert len(cases) == 23  # module 10, module at 16384 tokens 3, model 10
    errors = {k: c["error"] for k, c in cases.items() if "error" in c}
    assert errors == {}
    for key, case in cases.items():
        assert case["finite"], key
        if case["diff"] is not None:
            assert case["diff"] <= TOL[key.split("/")[1]], (key, case["diff"])


def test_probe_agrees_with_torch_flag_in_this_process():
    if O.built_with_linear():
        assert O.linear_supports(torch.float32)
        assert O.linear_supports(torch.bfloat16) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert not O.linear_supports(torch.float16) and not O.linear_supports(torch.float64)


def test_probe_failure_means_plain_path_never_an_error(monkeypatch):
    """A oneDNN that refuses the dtype (as on an AVX2 CPU in bf16): the probe says no, dense runs F.linear."""

    def refuse(*args):
        raise RuntimeError("could not create a primitive descriptor for the inner product forward")

    monkeypatch.setattr(O, "_probed", {})
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", refuse)
    assert not O.linear_supports(torch.float32) and not O.linear_supports(torch.bfloat16)
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    with torch.inference_mode():
        assert not fuses(x, w, b)
        for dtype in (torch.float32, torch.bfloat16):
            y = dense(x.to(dtype), w.to(dtype), b.to(dtype), activation_name="gelu_new")
            assert torch.equal(y, F.gelu(F.linear(x.to(dtype), w.to(dtype), b.to(dtype)), approximate="tanh"))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert dense(x, w, b).dtype == torch.bfloat16


def test_mkldnn_switch_turns_the_fused_path_off(monkeypatch):
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    with torch.inference_mode():
        assert fuses(x, w, None) is O.built_with_linear()
        monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
        assert not fuses(x, w, None)
        assert torch.equal(dense(x, w, None), F.linear(x, w))
