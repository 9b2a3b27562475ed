"""Measurement helpers shared by the benchmarks: the timing loop of each device, the peak-memory probe,
machine facts, the GEMM rate (the fresh process a case runs in: :mod:`nystrom_lab.bench.harness`).

Peak memory is the process's resident-set high-water mark (VmHWM) above its level right before the
measured call; the mark is reset through /proc/self/clear_refs. Callers run each case in a fresh
process and measure memory on its first call, before freed blocks can be recycled by the allocator;
timing then runs with the allocator's defaults, as users get it (on this VM first-touch page faults
cost about 0.4 ms per MB, so fresh allocations are part of every implementation's time). ``MALLOC``
names the other setting the training benchmark can run its children under: freed memory kept.
"""

from __future__ import annotations

import os
import platform
import statistics
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


def peak_memory_mb(fn: Callable[[], object], *, device: str = "cpu") -> float:
    """Peak memory (MB) used by one call of ``fn`` above the level before it, i.e. beyond its inputs and
    weights. CPU: the resident-set high-water mark (oneDNN's one-time set-up excluded, like imports);
    CUDA: the caching allocator's peak of allocated bytes (``fn``'s work synchronised)."""
    if device == "cuda":
        return _cuda_peak_memory_mb(fn)
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


def _cuda_peak_memory_mb(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return (peak - before) / 2**20


def call_times_s(
    fn: Callable[[], object],
    *,
    repeats: int,
    warmup: int = 0,
    budget_s: float = float("inf"),
    sync: Callable[[], object] | None = None,
) -> list[float]:
    """Wall times (s) of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones, each timed up to the
    return of ``sync()`` (a device's synchronize: its queued work counts); stops early, after at least one
    call, once ``budget_s`` is spent. The one host-clock timing loop of the benchmarks."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return times


def median_time_ms(
    fn: Callable[[], object], *, repeats: int = 5, budget_s: float = 20.0, warmup: int = 1
) -> float:
    """Median wall time (ms) of ``fn`` after ``warmup`` calls; stops early when ``budget_s`` is spent."""
    return 1e3 * statistics.median(call_times_s(fn, repeats=repeats, warmup=warmup, budget_s=budget_s))


def cuda_median_time_ms(
    fn: Callable[[], object], *, repeats: int = 20, warmup: int = 3, flush: torch.Tensor | None = None
) -> float:
    """Median device time (ms) of ``fn`` on the current CUDA stream, between two CUDA events around each
    call, after ``warmup`` calls: the GPU's timing loop (the stream's own clock: the host's synchronize
    latency is not counted). ``flush``, if given, is zeroed before each timed call (a cold L2 cache)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


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
