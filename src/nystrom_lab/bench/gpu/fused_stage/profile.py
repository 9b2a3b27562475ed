"""The fused stage's timings of whole calls: per-kernel GPU times from the profiler beside SDPA's (a), and
the module eager against its CUDA-graph replay (b).

Legend: b batch (1), h heads, n tokens, d head dim, m landmarks, e = h·d the module's width.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from nystrom_lab.bench.gpu.fused_stage.common import (
    KERNELS,
    Clock,
    Setting,
    attention,
    conv_weight,
    fused,
    guarded,
    projection,
    sync,
)

#: profiled calls per case (after two warm-up calls)
ITERS = 5
#: the profiled calls: forward (inference) and forward + backward; the methods, with their conv taps (None:
#: the setting's)
MODES = ("fwd", "fwdbwd")
METHODS = (("fused", None), ("fused-noconv", 0), ("sdpa", 0))
#: the module's timed calls
GRAPH_MODES = ("inference", "train")
#: calls per eager / replayed timing loop
LOOP = 20


def _name(event_name: str) -> str:
    """A fused kernel's name (Triton's older versions add a suffix of argument attributes, ``_0d1d2de``),
    else ``aten: `` and the kernel's name, shortened."""
    base = event_name.split("(")[0].strip()
    for kernel in KERNELS:
        if re.fullmatch(re.escape(kernel) + r"(_[0-9a-z]*\d[0-9a-z]*)?", base):
            return kernel
    return "aten: " + re.sub(r"^void ", "", event_name)[:90]


def kernel_times(events, iters: int, device: str) -> dict:
    """Per-call device µs by kernel name (the fused kernels by name, the rest as ``aten: …``) from the
    profiler's events; on the CPU (dry runs) the top-level ops' wall µs instead."""
    from torch.autograd import DeviceType

    want = DeviceType.CUDA if device == "cuda" else DeviceType.CPU
    us: dict[str, float] = collections.defaultdict(float)
    count = 0
    for e in events:
        if e.device_type != want or (device != "cuda" and e.cpu_parent is not None):
            continue
        us[_name(e.name)] += e.time_range.elapsed_us()
        count += 1
    kernels = {k: round(v / iters, 2) for k, v in sorted(us.items(), key=lambda kv: -kv[1])}
    triton = sum(v for k, v in kernels.items() if k in KERNELS)
    total = sum(kernels.values())
    return {"total_us": round(total, 2), "fused_kernels_us": round(triton, 2),
            "aten_us": round(total - triton, 2), "device_events_per_call": count / iters,
            "kernels": kernels}  # fmt: skip


def _sdpa(q, k, v, device: str) -> tuple[Callable[[], torch.Tensor], str]:
    """SDPA restricted to flash on a GPU (the default backend where flash refuses these inputs)."""
    if device != "cuda":
        return (lambda: F.scaled_dot_product_attention(q, k, v)), "default (CPU)"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def flash():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v)

    try:
        flash()
        return flash, "flash"
    except RuntimeError as err:
        return (lambda: F.scaled_dot_product_attention(q, k, v)), f"default (flash refused: {err})"[:300]


def _case(s: Setting, n: int, mode: str, method: str, taps: int) -> dict:
    from nystrom.ops.nystrom.fused import LAUNCHES

    proj, q, k, v = projection(n, s.heads, s.dim_head, s.dtype, s.device, grad=mode == "fwdbwd")
    grad = torch.randn(1, s.heads, n, s.dim_head, device=s.device, dtype=s.dtype)
    backend = None
    if method == "sdpa":
        call, backend = _sdpa(q, k, v, s.device)
    else:
        w = conv_weight(s.heads, taps, s.dtype, s.device)

        def call():
            with fused(True):
                return attention(q, k, v, w, s.landmarks)

    def fn():
        if mode == "fwd":
            with torch.no_grad():
                return call()
        return torch.autograd.grad(call(), proj, grad)

    for _ in range(2):
        fn()
    sync(s.device)
    before = sum(LAUNCHES.values())
    fn()
    launches = sum(LAUNCHES.values()) - before
    activities = [torch.profiler.ProfilerActivity.CPU]
    if s.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    iters = ITERS if s.device == "cuda" else 1
    sync(s.device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(iters):
            fn()
        sync(s.device)
    res = kernel_times(prof.events(), iters, s.device)
    res["triton_launches_per_call"] = launches
    if backend:
        res["backend"] = backend
    return res


def profile(s: Setting, clock: Clock) -> dict:
    """(a) The fused op (conv skip on and off) and SDPA at each length, forward (inference) and forward +
    backward (to the (1, n, 3·h·d) projection), device µs per call by kernel; their ratios."""
    rows = []
    for n in s.lengths:
        for mode in MODES:
            for method, taps in METHODS:
                taps = s.taps if taps is None else taps
                row = {"n": n, "mode": mode, "method": method, "conv_taps": taps}
                if clock.left() < 3:
                    row["skipped"] = f"over the stage's time budget ({clock.left():.0f} s left)"
                else:
                    guarded(row, lambda: _case(s, n, mode, method, taps))
                rows.append(row)
    total = {(r["n"], r["mode"], r["method"]): r.get("total_us") for r in rows}
    ratios = []
    for n in s.lengths:
        for mode in MODES:
            sdpa = total.get((n, mode, "sdpa"))
            for method in ("fused", "fused-noconv"):
                ours = total.get((n, mode, method))
                if ours and sdpa:
                    ratio = round(ours / sdpa, 3)
                    ratios.append({"n": n, "mode": mode, "method": method, "over_sdpa": ratio})
    return {"rows": rows, "ratios": ratios, "iters": ITERS if s.device == "cuda" else 1}


def _loop(fn: Callable[[], object], device: str, calls: int) -> dict:
    """Per call: the host's time to issue ``calls`` calls, and the wall time until the device is done."""
    sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter()
    sync(device)
    done = time.perf_counter()
    per_call = lambda t: round((t - start) * 1e3 / calls, 4)  # noqa: E731
    return {"host_ms": per_call(issued), "wall_ms": per_call(done)}


def _graph(step: Callable[[], object], *, grad: bool) -> torch.cuda.CUDAGraph:
    """``step`` captured as a CUDA graph after three warm-up calls on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.set_grad_enabled(grad):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.set_grad_enabled(grad), torch.cuda.graph(graph):
        step()
    return graph


def graphs(s: Setting, clock: Clock) -> dict:
    """(b) ``NystromAttention`` (e = h·d, the conv skip on) eager, per call: the host's issue time and the
    wall time, against the same call replayed as one CUDA graph; inference and a training step (forward
    + backward, gradients set to None first)."""
    from nystrom import NystromAttention

    e = s.heads * s.dim_head
    mod = NystromAttention(e, heads=s.heads, dim_head=s.dim_head, num_landmarks=s.landmarks,
                           conv_kernel_size=s.taps or None).to(device=s.device, dtype=s.dtype)  # fmt: skip
    calls = LOOP if s.device == "cuda" else 2
    rows = []
    for n in s.lengths:
        torch.manual_seed(0)
        x = torch.randn(1, n, e, device=s.device, dtype=s.dtype)
        gy = torch.randn_like(x)
        for mode in GRAPH_MODES:
            row = {"n": n, "mode": mode, "calls": calls}
            rows.append(row)
            if clock.left() < 4:
                row["skipped"] = f"over the stage's time budget ({clock.left():.0f} s left)"
                continue

            def step(mode=mode):
                if mode == "inference":
                    return mod(x)
                mod.zero_grad(set_to_none=True)
                mod(x).backward(gy)

            def measure(mode=mode, step=step, row=row):
                with fused(True), torch.set_grad_enabled(mode == "train"):
                    step()
                    eager = _loop(step, s.device, calls)
                    res = {f"eager_{k}": v for k, v in eager.items()}
                    if s.device != "cuda":
                        return res | {"graph": "skipped: needs CUDA"}
                    graph = _graph(step, grad=mode == "train")
                    replay = _loop(graph.replay, s.device, calls)
                    res |= {"graph_ms": replay["wall_ms"], "graph_host_ms": replay["host_ms"],
                            "eager_over_graph": round(eager["wall_ms"] / replay["wall_ms"], 3),
                            "host_bound": eager["host_ms"] > 0.8 * eager["wall_ms"]}  # fmt: skip
                    del graph
                    return res

            guarded(row, measure)
    module = (f"NystromAttention({e}, heads={s.heads}, dim_head={s.dim_head}, num_landmarks={s.landmarks}, "
              f"conv_kernel_size={s.taps or None}), {str(s.dtype).removeprefix('torch.')}")  # fmt: skip
    return {"module": module, "rows": rows}
