"""Measurement helpers shared by the benchmarks: timing, peak memory, machine facts, GEMM rate, the child
process a case runs in.

Peak memory is the process's resident-set high-water mark (VmHWM) above its level right before the
measured call; the mark is reset through /proc/self/clear_refs. Callers run each case in a fresh
process and measure memory on its first call, before freed blocks can be recycled by the allocator;
timing then runs with the allocator's defaults, as users get it (on this VM first-touch page faults
cost about 0.4 ms per MB, so fresh allocations are part of every implementation's time). ``MALLOC``
names the other setting the training benchmark can run its children under: freed memory kept.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from nystrom_lab.bench.malloc import MALLOC, malloc_env  # noqa: F401 (re-exported)
from nystrom_lab.data.records import environment
from nystrom_lab.docs.markers import replace_section  # noqa: F401 (re-exported: the bench writers use it)

CHILD_ENV = {"PYTHONUNBUFFERED": "1"}

def allocator_info(extra_env: dict[str, str]) -> str:
    """A line for the report: the allocator settings the children ran under."""
    env = {**os.environ, **extra_env}
    parts = [f"{k}={env[k]}" for k in ("LD_PRELOAD", "GLIBC_TUNABLES", "MALLOC_ARENA_MAX") if env.get(k)]
    libc = "-".join(platform.libc_ver()) or "unknown libc"
    return f"{libc}, " + (", ".join(parts) if parts else "default settings")


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status (Linux only)")


def _set_up_onednn() -> None:
    """Run oneDNN's fused linear once on a tiny input. Its first call in a process maps the library's code and
    JIT buffers (≈ 5 MB RSS, measured), a one-time cost like an import that would otherwise land in whichever
    case runs it first, and differently in a fresh process than in a forked one."""
    from nystrom.layers.dense import dense, fuses

    x, w, b = torch.zeros(2, 8), torch.zeros(16, 8), torch.zeros(16)
    with torch.inference_mode():
        if fuses(x, w, b):
            dense(x, w, b, activation_name="gelu")


def peak_memory_mb(fn: Callable[[], object]) -> float:
    """Peak resident memory (MB) used by one call of ``fn`` above the level before it (oneDNN's one-time
    set-up excluded, like imports)."""
    _set_up_onednn()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError as err:
        raise RuntimeError("peak memory needs Linux /proc/self/clear_refs") from err
    before = _status_kb("VmRSS")
    out = fn()
    peak = _status_kb("VmHWM")
    del out
    return max(0.0, (peak - before) / 1024)  # RSS freed between the reset and `before` is no negative peak


def median_time_ms(
    fn: Callable[[], object], *, repeats: int = 5, budget_s: float = 20.0, warmup: int = 1
) -> float:
    """Median wall time (ms) of ``fn`` after ``warmup`` calls; stops early when ``budget_s`` is spent."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and len(times) >= 1:
            break
    return 1e3 * statistics.median(times)


def median_time_and_gemm_rate(
    fn: Callable[[], object], *, repeats: int = 5, budget_s: float = 20.0, warmup: int = 1, size: int = 2048
) -> tuple[float, float]:
    """Median wall time (ms) of ``fn`` and median fp32 GFLOP/s of a square ``size`` matmul timed alternately.

    Why: the speed of a shared VM drifts within minutes (a run's GEMM rate measured 186 GFLOP/s before
    and 100 after); a FLOP floor whose rate is measured call by call beside the case compares like with like.
    """
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(warmup):
        fn()
        a @ b
    times: list[float] = []
    rates: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        a @ b
        t1 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t1)
        rates.append(2 * size**3 / (t1 - t0) / 1e9)
        if time.perf_counter() - start > budget_s:
            break
    return 1e3 * statistics.median(times), statistics.median(rates)


def gemm_gflops(size: int = 2048, repeats: int = 7) -> float:
    """fp32 GFLOP/s of a large square ``torch.matmul`` on this machine (the FLOP floor's denominator)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    ms = median_time_ms(lambda: a @ b, repeats=repeats, warmup=2)
    return 2 * size**3 / (ms / 1e3) / 1e9


def machine_info() -> dict[str, str]:
    """The machine and versions a benchmark report prints (:func:`nystrom_lab.data.records.environment`, as
    text: ``"not installed"`` for a missing package)."""
    env = environment("transformers", "nystrom_attention")
    return {k: "not installed" if v is None else str(v) for k, v in env.items()}


def run_child(module: str, args: list[str], *, timeout_s: float, env: dict[str, str] | None = None) -> dict:
    """Run ``python -m module args`` in a fresh process (``env`` added to this one's); its last stdout line
    is a JSON dict."""
    env = {**os.environ, **CHILD_ENV, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=timeout_s
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        return {"error": " | ".join(tail) or f"exit code {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])
