"""The fused stage's sweep (c): ``num_warps``, ``num_stages`` and the token block ``BN`` per kernel.

Each :data:`UNITS` entry is a kernel whose launches take a :func:`~nystrom.ops.nystrom.fused.launch.tuned`
override (the per-head kernels also their m×m products' ``PINV_DOT`` precision, where the kernels take
it); a configuration is timed by running the real call (forward, or forward then backward) under
``tuned({kernel: config})`` with the launches recorded, then replaying only the unit's recorded launches
(as a CUDA graph, after writing 256 MB so that L2 starts cold) between CUDA events: the median of
``reps``. ``query_backward``'s ``BN`` is also ``key_backward``'s (they share the splits), so that unit
times the two together, and ``key_backward``'s own warps and stages are swept at the chosen ``BN``.
``key_pass`` is timed with ``key_combine``, which merges its splits. A configuration that raises (Triton's
``OutOfResources``: too much shared memory) is recorded with the error and skipped.

Compiling is most of the cost (1-12 s a configuration on a CPU core), so :mod:`.workers` first compiles
every configuration of :func:`jobs` in parallel processes that run the same calls; the timing process
then finds them in Triton's disk cache. A configuration a worker began and did not finish is not retried.

A unit's choice is the configuration with the smallest mean, over the lengths, of its time ÷ the
launchers' default's time (measured without any override); it replaces the default only when ≥ 3 %
faster. ``OUT/fused_tuning.json`` holds the choices::

    {"format": 1, "setting": {...}, "gpu": ..., "torch": ..., "triton": ...,
     "chosen":   {KERNEL: {"num_warps": W, "num_stages": S[, "BN": B][, "PINV_DOT": P]}, ...},
                                                # a mapping for launch.tuned()
     "defaults": {KERNEL: {...}, ...},          # what the launchers passed (num_stages 3: Triton's default)
     "speedup":  {KERNEL: default ÷ chosen time, mean over the lengths},
     "kernel_us": {KERNEL: {N: {"default": µs, "chosen": µs}}},
     "check": {"fwd"|"fwdbwd": {N: {"default_ms": .., "chosen_ms": ..}}}}   # whole calls, CUDA events

``OUT/fused_sweep.json`` holds every configuration's times, errors and compile seconds.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
from typing import NamedTuple

import torch

from nystrom_lab.bench.gpu.fused_stage.common import (
    Clock,
    Setting,
    attention,
    conv_weight,
    flush_buffer,
    fused,
    projection,
    sync,
    timed_ms,
)


class Unit(NamedTuple):
    kernel: str  # the kernel whose launches take the override
    timed: tuple[str, ...]  # the kernels whose recorded launches are timed together
    backward: bool
    warps: tuple[int, ...]  # the launchers' default first
    stages: tuple[int, ...]
    blocks: tuple[int, ...]  # token blocks BN (the default first); () where the kernel has none
    dots: bool = False  # a per-head kernel: its m×m products' PINV_DOT precisions too (launch.PINV_DOTS)


STAGES = (3, 2, 1)  # Triton's default first
#: in order of priority (the budget cuts the last): the spilling pinv backward first (docs/fused_kernels.md)
UNITS = (
    Unit("landmark_backward", ("landmark_backward",), True, (16, 8, 4), STAGES, (), dots=True),
    Unit("query_backward", ("query_backward", "key_backward"), True, (4, 8), STAGES, (64, 32, 128)),
    Unit("key_backward", ("key_backward",), True, (4, 8), STAGES, ()),
    Unit("key_pass", ("key_pass", "key_combine"), False, (4, 8), STAGES, (64, 32, 128)),
    Unit("query_pass", ("query_pass",), False, (4, 8), STAGES, (64, 32, 128)),
    Unit("landmark_pinv", ("landmark_pinv",), False, (8, 16, 4), STAGES, (), dots=True),
)
#: a choice replaces the default only when this much faster (the timing's noise)
MIN_GAIN = 0.03
#: configurations per unit in a dry run (the interpreter is slow and times nothing real)
DRY_CONFIGS = 2
#: the whole calls of the final check: forward (inference), forward + backward
MODES = ("fwd", "fwdbwd")


def configs(unit: Unit, dry: bool = False) -> list[dict]:
    """The unit's grid, nearest the default first; a per-head kernel's other ``PINV_DOT`` precisions last,
    at the first warps and stages."""
    from nystrom.ops.nystrom.fused.launch import PINV_DOT, PINV_DOTS

    out = [{"num_warps": w, "num_stages": st} | ({"BN": bn} if bn else {})
           for bn, w, st in itertools.product(unit.blocks or (0,), unit.warps, unit.stages)]  # fmt: skip
    if unit.dots:
        out += [{"num_warps": unit.warps[0], "num_stages": unit.stages[0], "PINV_DOT": dot}
                for dot in PINV_DOTS if dot != PINV_DOT]  # fmt: skip
    return out[:DRY_CONFIGS] if dry else out


def jobs(dry: bool = False) -> list[tuple[str, dict]]:
    """Every (unit, configuration) the workers compile, in priority order."""
    return [(u.kernel, c) for u in UNITS for c in configs(u, dry)]


def key(kernel: str, config: dict) -> str:
    return kernel + " " + json.dumps(config, sort_keys=True)


class Data(NamedTuple):
    proj: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    w: torch.Tensor | None
    grad: torch.Tensor


def data(s: Setting, n: int) -> Data:
    proj, q, k, v = projection(n, s.heads, s.dim_head, s.dtype, s.device, grad=True)
    grad = torch.randn(1, s.heads, n, s.dim_head, device=s.device, dtype=s.dtype)
    return Data(proj, q, k, v, conv_weight(s.heads, s.taps, s.dtype, s.device), grad)


@contextlib.contextmanager
def recording(names: tuple[str, ...]):
    """Within the block the fused launchers' launches of ``names`` are recorded (kernel, grid, args, meta)."""
    from nystrom.ops.nystrom.fused import backward, forward
    from nystrom.ops.nystrom.fused import launch as launching

    got = []

    def record(kernel, grid, *args, **meta):
        if kernel.__name__ in names:
            got.append((kernel, grid, args, meta))
        return launching.launch(kernel, grid, *args, **meta)

    before = {mod: mod.launch for mod in (forward, backward)}
    for mod in before:
        mod.launch = record
    try:
        yield got
    finally:
        for mod, fn in before.items():
            mod.launch = fn


def run_once(s: Setting, d: Data, unit: Unit, overrides: dict) -> list:
    """One real call with ``overrides`` (``tuned``'s mapping): the unit's launches, recorded."""
    from nystrom.ops.nystrom.fused.launch import tuned

    with fused(True):
        if unit.backward:
            out = attention(d.q, d.k, d.v, d.w, s.landmarks)
            with tuned(overrides), recording(unit.timed) as got:
                torch.autograd.grad(out, d.proj, d.grad)
        else:
            with torch.no_grad(), tuned(overrides), recording(unit.timed) as got:
                attention(d.q, d.k, d.v, d.w, s.landmarks)
    sync(s.device)
    return got


def replay_ms(s: Setting, got: list, overrides: dict, flush) -> tuple[float, bool]:
    """Median ms of the recorded launches replayed with ``overrides``; whether as a CUDA graph."""
    from nystrom.ops.nystrom.fused import launch as launching

    def fn():
        with launching.tuned(overrides):
            for kernel, grid, args, meta in got:
                launching.launch(kernel, grid, *args, **meta)

    if s.device == "cuda":
        with contextlib.suppress(RuntimeError):  # not capturable: timed as launches
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            return timed_ms(graph.replay, s.device, s.reps, flush=flush), True
    return timed_ms(fn, s.device, s.reps, flush=flush), False


def launched(got: list, unit: Unit) -> dict:
    """What the launcher passed for the unit's kernel (before any override; num_warps 4 and num_stages 3
    where it left Triton's defaults), its BN and PINV_DOT where the unit tunes them."""
    meta = next(meta for kernel, _grid, _args, meta in got if kernel.__name__ == unit.kernel)
    return ({"num_warps": meta.get("num_warps", 4), "num_stages": meta.get("num_stages", 3)}
            | ({"BN": meta["BN"]} if unit.blocks and "BN" in meta else {})
            | ({"PINV_DOT": meta["PINV_DOT"]} if unit.dots and "PINV_DOT" in meta else {}))  # fmt: skip


# -- the timing process -----------------------------------------------------------------------------------


def _time(s: Setting, inputs: dict, unit: Unit, overrides: dict, flush) -> dict:
    res: dict = {"us": {}}
    for n, d in inputs.items():
        got = run_once(s, d, unit, overrides)
        if sorted({launch[0].__name__ for launch in got}) != sorted(unit.timed):
            names = [g[0].__name__ for g in got]
            raise RuntimeError(f"recorded {names}, not {unit.timed}: do the launchers still call their"
                               " module's `launch`?")  # fmt: skip
        ms, graphed = replay_ms(s, got, overrides, flush)
        res["us"][str(n)] = round(ms * 1e3, 2)
        res["launched"] = launched(got, unit)
        res["graphed"] = graphed
    return res


def sweep(s: Setting, clock: Clock, compiled: dict[str, dict] | None, *, margin: float = 8.0) -> dict:
    """Time every unit's default and configurations at each length; choose (see the module's doc).
    ``compiled``: the workers' log (None: no workers, compile here); ``margin``: seconds kept at the end."""
    from nystrom.ops.nystrom.fused import LAUNCHES

    saved = LAUNCHES.copy()
    flush = flush_buffer(s.device)
    inputs = {n: data(s, n) for n in s.lengths}
    planned = {key(k, c) for k, c in jobs(s.dry)}
    units, chosen = [], {}
    for unit in UNITS:
        shared = {"query_backward": {"BN": chosen["query_backward"]["BN"]}} if (
            unit.kernel == "key_backward" and "BN" in chosen.get("query_backward", {})) else {}  # fmt: skip
        entry = {"kernel": unit.kernel, "timed": list(unit.timed), "with": shared, "configs": []}
        units.append(entry)
        if clock.left(margin) < 0:
            entry["skipped"] = "over the stage's time budget"
            continue
        try:
            base = _time(s, inputs, unit, shared, flush)
        except Exception as err:
            entry["error"] = f"default: {type(err).__name__}: {err}"[:1000]
            continue
        entry["default"], entry["default_us"] = base["launched"], base["us"]
        no_bn = False
        for config in configs(unit, s.dry):
            row = {"config": config}
            entry["configs"].append(row)
            job = compiled.get(key(unit.kernel, config), {}) if compiled is not None else {}
            if job.get("compile_s") is not None:
                row["compile_s"] = job["compile_s"]
            if clock.left(margin) < 0:
                row["skipped"] = "over the stage's time budget"
            elif no_bn and config.get("BN", entry["default"].get("BN")) != entry["default"].get("BN"):
                row["skipped"] = "BN is not applied by the launchers"
            elif job.get("error"):
                row["error"] = job["error"]
            elif compiled is not None and key(unit.kernel, config) in planned and not job.get("done"):
                row["skipped"] = "not compiled by the workers in time" + (" (started)" if job else "")
            else:
                try:
                    row |= _time(s, inputs, unit, shared | {unit.kernel: config}, flush)
                except Exception as err:
                    row["error"] = f"{type(err).__name__}: {err}"[:1000]
                    continue
                bn = row.pop("launched").get("BN")  # what the launcher passed (the override comes after)
                if "BN" in config and bn != config["BN"]:
                    no_bn, row["skipped"] = True, "BN is not applied by the launchers"
                    row.pop("us")
                    continue
                row["score"] = round(statistics.mean(row["us"][n] / base["us"][n] for n in base["us"]), 4)
        timed = [r for r in entry["configs"] if "score" in r]
        best = min(timed, key=lambda r: r["score"], default=None)
        if best is not None and best["score"] <= 1 - MIN_GAIN:
            speedup = round(1 / best["score"], 3)
            entry |= {"chosen": best["config"], "chosen_us": best["us"], "speedup": speedup}
        else:
            entry |= {"chosen": entry["default"], "chosen_us": base["us"], "speedup": 1.0}
        chosen[unit.kernel] = entry["chosen"]
    LAUNCHES.clear()
    LAUNCHES.update(saved)
    return {"units": units, "chosen": chosen, "min_gain": MIN_GAIN, "reps": s.reps}
