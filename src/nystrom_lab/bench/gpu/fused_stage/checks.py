"""The fused stage's checks: memory of the first call (d), the call past 2³¹ elements (e), two GPUs (f).

``python -m nystrom_lab.bench.gpu.fused_stage.checks OUT --until T [--go FILE] [--dry]`` runs (e) and (f)
in a process of their own (a fault there, e.g. an illegal address, cannot poison the stage's CUDA
context), after ``FILE`` exists (the stage's profiles are done: no GPU work beside them), and writes
``OUT/fused_long.json`` and ``OUT/fused_devices.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from nystrom_lab.bench.gpu.fused_stage.common import (
    Clock,
    Setting,
    attention,
    conv_weight,
    environment,
    fused,
    guarded,
    projection,
    setting,
    sync,
    write,
)

#: relative error allowed against the PyTorch path in bfloat16 (the kernel tests' tolerance to the oracle)
REL_TOL = 2e-2
#: seconds the 180K check's backward needs at least (its 4 kernels compile at d = 128, then both paths run)
LONG_BACKWARD_S = 25.0


def _mib(x: float) -> float:
    return round(x / 2**20, 1)


def _snapshot() -> dict:
    free, total = torch.cuda.mem_get_info()
    return {"free_mib": _mib(free), "total_mib": _mib(total),
            "allocated_mib": _mib(torch.cuda.memory_allocated()),
            "reserved_mib": _mib(torch.cuda.memory_reserved())}  # fmt: skip


def compiled_kernels() -> list[dict]:
    """The fused kernels this process compiled: warps, stages, registers, local memory (spill) bytes per
    thread and shared bytes, from Triton's per-device caches (empty under the interpreter)."""
    from nystrom.ops.nystrom.fused import backward_kernels, forward_kernels

    kernels = [getattr(module, name) for module in (forward_kernels, backward_kernels) for name in dir(module)
               if hasattr(getattr(module, name), "fn")]  # the @triton.jit kernels
    rows = []
    for fn in kernels:
        for entry in getattr(fn, "device_caches", {}).values():
            cache = entry[0] if isinstance(entry, tuple) else entry
            for compiled in getattr(cache, "values", dict)():
                md = getattr(compiled, "metadata", None)
                spills = getattr(compiled, "n_spills", None)
                rows.append({"kernel": getattr(md, "name", None) or fn.__name__,
                             "num_warps": getattr(md, "num_warps", None),
                             "num_stages": getattr(md, "num_stages", None),
                             "registers": getattr(compiled, "n_regs", None),
                             "local_bytes": None if spills is None else 4 * spills,
                             "shared_bytes": getattr(md, "shared", None)})  # fmt: skip
    return rows


def memory(s: Setting) -> dict:
    """``mem_get_info`` (the whole device's free memory) and the allocator's counts before and after the
    first forward + backward of the fused kernels in this fresh process: the difference outside the
    allocator is what loading the kernels reserves (code, and local memory for spilled registers: bytes
    per thread × the threads the device can hold)."""
    if s.device != "cuda":
        return {"skipped": "needs CUDA (torch.cuda.mem_get_info)"}
    torch.empty(0, device="cuda")  # the context
    context = _snapshot()
    n = s.lengths[-1]
    proj, q, k, v = projection(n, s.heads, s.dim_head, s.dtype, "cuda", grad=True)
    w = conv_weight(s.heads, s.taps, s.dtype, "cuda")
    grad = torch.randn(1, s.heads, n, s.dim_head, device="cuda", dtype=s.dtype)
    sync("cuda")
    inputs = _snapshot()
    start = time.perf_counter()
    with fused(True):
        attention(q, k, v, w, s.landmarks).backward(grad)
        sync("cuda")
        first_s = time.perf_counter() - start
        after = _snapshot()
        attention(q, k, v, w, s.landmarks).backward(grad)
        sync("cuda")
    second = _snapshot()
    kernels = compiled_kernels()
    props = torch.cuda.get_device_properties(0)
    threads = props.max_threads_per_multi_processor * props.multi_processor_count
    local = max((r["local_bytes"] or 0 for r in kernels), default=0)
    outside = (inputs["free_mib"] - after["free_mib"]) - (after["reserved_mib"] - inputs["reserved_mib"])
    return {"n": n, "context": context, "inputs": inputs, "after_first": after, "after_second": second,
            "first_call_s": round(first_s, 2),
            "free_drop_mib": round(inputs["free_mib"] - after["free_mib"], 1),
            "allocator_growth_mib": round(after["reserved_mib"] - inputs["reserved_mib"], 1),
            "outside_allocator_mib": round(outside, 1),
            "local_reservation_estimate_mib": _mib(local * threads),
            "note": "outside_allocator_mib: the driver's share of the first call (kernel modules, the local "
                    "memory that spilled registers need: max local bytes per thread × threads per SM × SMs "
                    "= local_reservation_estimate_mib)",
            "kernels": kernels}  # fmt: skip


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def long_call(s: Setting, clock: Clock) -> dict:
    """n = 180 000, h = 32, d = 128 (bf16, b = 1), q, k, v views of one (1, n, 3·h·d) projection: the
    token offsets pass 2³¹ elements. The fused output against the PyTorch path on the first and last rows
    (relative error), finite everywhere; then, if time is left, the projection's gradient of a loss on the
    last rows, both ways."""
    n, h, d, rows = s.long
    device = s.device
    proj, q, k, v = projection(n, h, d, s.dtype, device, grad=True)
    w = conv_weight(h, s.taps, s.dtype, device)
    res = {"n": n, "heads": h, "dim_head": d, "rows": rows, "conv_taps": s.taps,
           "largest_offset": (n - 1) * 3 * h * d + 3 * h * d - 1,
           "passes_2_31": (n - 1) * 3 * h * d >= 2**31}  # fmt: skip
    outs = {}
    for name, on in (("fused", True), ("pytorch", False)):
        with fused(on):
            start = time.perf_counter()
            outs[name] = attention(q, k, v, w, s.landmarks)
            sync(device)
            res[f"{name}_forward_s"] = round(time.perf_counter() - start, 3)  # the fused one compiles first
    out, ref = outs["fused"], outs["pytorch"]
    res["finite"] = bool(torch.isfinite(out).all())
    res["rel_err_last_rows"] = _rel(out[:, :, -rows:], ref[:, :, -rows:])
    res["rel_err_first_rows"] = _rel(out[:, :, :rows], ref[:, :, :rows])
    res["ok"] = res["finite"] and max(res["rel_err_last_rows"], res["rel_err_first_rows"]) < REL_TOL
    if clock.left() < LONG_BACKWARD_S:
        res["backward"] = {"skipped": f"over the stage's time budget ({clock.left():.0f} s left)"}
        return res
    torch.manual_seed(2)
    weight = torch.randn(1, h, rows, d, device=device, dtype=torch.float32)
    grads = {}
    with fused(True):
        grads["fused"] = torch.autograd.grad((out[:, :, -rows:].float() * weight).sum(), proj)[0]
    del out
    with fused(False):
        grads["pytorch"] = torch.autograd.grad((ref[:, :, -rows:].float() * weight).sum(), proj)[0]
    sync(device)
    gf, gp = (g.reshape(1, n, 3, h, d) for g in (grads["fused"], grads["pytorch"]))
    back = {"finite": bool(torch.isfinite(gf).all())}
    for i, name in enumerate("qkv"):  # the rows whose gradients read or write past 2³¹: the last ones
        back[f"rel_err_d{name}_last_rows"] = _rel(gf[:, -rows:, i], gp[:, -rows:, i])
    back["ok"] = back["finite"] and max(v for k, v in back.items() if k.startswith("rel_err")) < 3 * REL_TOL
    res["backward"] = back
    return res


def devices(s: Setting) -> dict:
    """Inputs on ``cuda:1`` while ``cuda:0`` is current: the output and gradients equal the same call's on
    ``cuda:0`` (the kernels must launch on the inputs' device), and ``cuda:0`` stays current."""
    if s.device != "cuda":
        return {"skipped": "needs CUDA"}
    if torch.cuda.device_count() < 2:
        return {"skipped": "one GPU"}
    torch.cuda.set_device(0)
    n = s.lengths[0]
    results = {}
    for dev in ("cuda:1", "cuda:0"):
        proj, q, k, v = projection(n, s.heads, s.dim_head, s.dtype, dev, grad=True)
        w = conv_weight(s.heads, s.taps, s.dtype, dev)
        with fused(True):
            out = attention(q, k, v, w, s.landmarks)
            (grad,) = torch.autograd.grad(out.float().square().sum(), proj)
        results[dev] = (out.cpu(), grad.cpu())
        torch.cuda.synchronize(dev)
    (o1, g1), (o0, g0) = results["cuda:1"], results["cuda:0"]
    same = bool(torch.equal(o1, o0) and torch.equal(g1, g0))
    return {"n": n, "current_after": torch.cuda.current_device(), "output_equal": bool(torch.equal(o1, o0)),
            "grad_equal": bool(torch.equal(g1, g0)),
            "output_max_diff": float((o1.float() - o0.float()).abs().max()),
            "grad_max_diff": float((g1.float() - g0.float()).abs().max()),
            "ok": same and torch.cuda.current_device() == 0}  # fmt: skip


def run_checks(out: Path, s: Setting, clock: Clock) -> None:
    """(e) then (f), each guarded, each written as it ends."""
    env = environment(s)
    long = guarded({**env}, lambda: long_call(s, clock))
    write(out, "long", long)
    print("fused long:", {k: long.get(k) for k in ("ok", "rel_err_last_rows", "finite", "error")}, flush=True)
    if s.device == "cuda":
        torch.cuda.empty_cache()
    two = guarded({**env}, lambda: devices(s))
    write(out, "devices", two)
    print("fused devices:", {k: two.get(k) for k in ("ok", "skipped", "error")}, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nystrom_lab.bench.gpu.fused_stage.checks")
    p.add_argument("out", type=Path)
    p.add_argument("--until", type=float, required=True, help="time.monotonic() deadline")
    p.add_argument("--go", type=Path, default=None, help="start once this file exists")
    p.add_argument("--dry", action="store_true")
    a = p.parse_args(argv)
    s, clock = setting(a.dry), Clock(a.until)
    if s.device == "cuda":
        torch.empty(0, device="cuda")  # the context while waiting
    while a.go is not None and not a.go.exists() and clock.left() > 0:
        time.sleep(0.2)
    run_checks(a.out, s, clock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
