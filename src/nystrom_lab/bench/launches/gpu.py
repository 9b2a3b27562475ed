"""The launch work's GPU check in one command, for a lent GPU machine: the launch work's ``gpu`` tests, and the
real kernel launches and forward times of ``nystrom bench launches``' cases (to check the meta-device
counts of docs/gpu/launches.md).

``PYTHONPATH=src:tests python3 -m nystrom_lab.bench.launches.gpu OUT [n] [--no-tests]`` (about 3 minutes) writes
``OUT/gpu_tests.txt`` (``pytest -m gpu`` of the Triton pinv, CUDA graphs and the GPU suite) and
``OUT/launches_gpu.json``: versions, and per case and side the CUDA launches (runtime/driver launch
calls seen by ``torch.profiler``: kernels, memsets, copies, graph launches) and host syncs of one forward
and of a forward + backward, the median inference forward in ms (CUDA events), and our model's forward
replayed as a CUDA graph (``GraphedForward``). Needs CUDA (refuses otherwise).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from nystrom_lab.bench.launches.cases import CASES, SIDES, N, build, ours_model
from nystrom_lab.bench.measure import cuda_median_time_ms

#: profiler event names of host calls that start device work, and of those that wait for the device
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
            "cudaMemsetAsync", "cudaMemcpyAsync")  # fmt: skip
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


#: the profiler range that holds the measured call: calls outside it are the profiler's own
MEASURED = "nystrom::measured"


def count_in_range(events: list, *, measured: str = MEASURED) -> dict[str, int]:
    """Launch and sync calls among profiler ``events`` that start inside the ``measured`` range.

    Why a range: stopping ``torch.profiler`` synchronises the device itself (``cudaDeviceSynchronize``),
    so a count over every event reported 1 sync for every call, transformers' unmasked module included
    (the 2026-11-28 H100 run). Events outside the range are counted apart as ``profiler_syncs``."""
    spans = [e.time_range for e in events if e.name == measured]
    if len(spans) != 1:
        raise RuntimeError(f"expected one {measured!r} range among the profiler's events, got {len(spans)}")
    span = spans[0]
    inside = [e.name for e in events if span.start <= e.time_range.start <= span.end]
    outside = [e.name for e in events if not span.start <= e.time_range.start <= span.end]
    return {
        "launches": sum(n in LAUNCHES for n in inside),
        "syncs": sum(n in SYNCS for n in inside),
        "profiler_syncs": sum(n in SYNCS for n in outside),
    }


def host_calls(fn: Callable[[], object]) -> dict[str, int]:
    """Launch and sync calls of one ``fn()`` (the device is idle before and after)."""
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        with torch.profiler.record_function(MEASURED):
            fn()
    torch.cuda.synchronize()
    return count_in_range(list(prof.events()))


def measure(case: str, side: str, *, n: int) -> dict:
    """Launches and syncs of one forward (grad mode, as the meta counts) and forward + backward, and the
    inference forward's time."""
    call = build(case, side, n=n, device="cuda")
    grad = torch.ones_like(call())  # the first call's one-time work (cuBLAS, Triton) stays out of the counts
    result = {"forward": host_calls(call), "forward_backward": host_calls(lambda: call().backward(grad))}
    with torch.inference_mode():
        result["forward_ms"] = cuda_median_time_ms(call)
    return result


def graphed_forward_ms(*, n: int) -> float:
    """Our MiniLM-size model's inference forward replayed as one CUDA graph (a padding mask of ones)."""
    from nystrom.utils.graphs import GraphedForward

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = ours_model(n=n)
        ids, mask = torch.zeros(1, n, dtype=torch.long), torch.ones(1, n, dtype=torch.long)
    run = GraphedForward(
        model, lambda i, m: model(input_ids=i, attention_mask=m).last_hidden_state, buckets=(n,)
    )
    with torch.inference_mode():
        return cuda_median_time_ms(lambda: run(ids, mask))


#: the ``gpu`` tests of the launch work and the GPU suite
GPU_TESTS = ("tests",)  # every test marked gpu: `pytest -m gpu` in full


def run_gpu_tests(out: Path, *, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``pytest -m gpu`` of :data:`GPU_TESTS`; its log's tail to ``out/gpu_tests.txt``."""
    args = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-rA", "-p", "no:cacheprovider", *GPU_TESTS]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as stopped:  # keep what ran: the log says where it stopped
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        done = subprocess.CompletedProcess(args, 124, text(stopped.stdout) + f"\n[stopped after {timeout_s:.0f} s]\n",
                                           text(stopped.stderr))  # fmt: skip
    (out / "gpu_tests.txt").write_text(done.stdout[-20000:] + done.stderr[-5000:], encoding="utf-8")
    print(done.stdout[-3000:])
    return done


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("launches_gpu needs a CUDA GPU")
    no_tests = "--no-tests" in argv  # the tests run elsewhere (scripts/gpu_bench.sh: a stage of their own)
    argv = [a for a in argv if a != "--no-tests"]
    out = Path(argv[0])
    n = int(argv[1]) if len(argv) > 1 else N
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.CompletedProcess([], returncode=None) if no_tests else run_gpu_tests(out)
    triton = importlib.util.find_spec("triton") is not None
    report = {"n": n, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "triton": triton, "gpu_tests_rc": done.returncode,
              "cases": {case: {side: measure(case, side, n=n) for side in SIDES} for case in CASES}}  # fmt: skip
    report["ours_model_graphed_forward_ms"] = graphed_forward_ms(n=n)
    (out / "launches_gpu.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
