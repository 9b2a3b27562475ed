"""Training benchmark: forward, backward and peak memory of one attention layer, plus one ListOps step.

Legend: b batch (1), n tokens, h heads, d head dim, e = h·d model width, m landmarks, K conv kernel.

Regimes: ``paper`` (e = 512, h = 8, m = 64, no conv, no dropout) and ``transmil`` (TransMIL's layer:
e = 512, h = 8, m = 256, residual conv K = 33, dropout 0.1). Implementations: ours, HuggingFace's,
lucidrains' and exact fused SDPA (``nystrom.attention.SoftmaxAttention``), all in training mode.

Timing: one fresh process per (regime, n) builds every implementation on the same input and runs
interleaved rounds (each round calls every implementation once, in a rotated order, and times one
2048² GEMM for the floor), so slow spells of the machine hit all of them alike. A figure is the median
over rounds; its spread is (max − min) / median; a speed-up is the median of the per-round ratios.
Memory: one more fresh process per (implementation, regime, n) measures the peak resident memory of
its first forward + backward (see ``measure.peak_memory_mb``). ``quick=True`` runs everything in this
process at toy sizes: a smoke test, not a measurement.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from nystrom.attention import NystromAttention, SoftmaxAttention
from nystrom_lab.bench.comparisons import HFSelfAttention, lucidrains_layer
from nystrom_lab.bench.floors import attention_layer_training_floor_ms
from nystrom_lab.bench.harness import run_case
from nystrom_lab.bench.measure import (
    allocator_info,
    machine_info,
    malloc_env,
    peak_memory_mb,
    replace_section,
)
from nystrom_lab.bench.training.listops_step import listops_step
from nystrom_lab.bench.training.report import QUICK, REGIMES, plot, report

IMPLS = ("nystrom", "nystrom-recompute", "hf", "lucidrains", "sdpa")
MAX_SDPA_N = 16384  # exact attention is O(n²): 64k tokens take minutes per call
GEMM = 2048


def _regime(name: str, quick: bool) -> dict:
    return (QUICK if quick else REGIMES)[name]


def build_module(impl: str, regime: dict, n: int) -> nn.Module:
    """One attention layer of ``impl`` in training mode: (1, n, e) -> (1, n, e)."""
    h, d, m, conv, p = regime["h"], regime["d"], regime["m"], regime["conv"], regime["dropout"]
    e = h * d
    if impl in ("nystrom", "nystrom-recompute"):
        mod = NystromAttention(
            e, heads=h, dim_head=d, num_landmarks=m, conv_kernel_size=conv, dropout=p,
            recompute=impl == "nystrom-recompute",
        )  # fmt: skip
    elif impl == "sdpa":
        mod = SoftmaxAttention(e, heads=h, dim_head=d, dropout=p)  # exact: no conv skip
    elif impl == "hf":
        mod = HFSelfAttention(e, heads=h, landmarks=m, n=n, conv_kernel=conv, dropout=p)
    else:
        mod = lucidrains_layer(e, heads=h, dim_head=d, landmarks=m, conv_kernel=conv, dropout=p)
    return mod.train()


def _fwd_bwd(mod: nn.Module, x: torch.Tensor, g: torch.Tensor) -> tuple[float, float]:
    """One forward and one backward (of a fixed random output gradient); returns their ms."""
    x.grad = None
    mod.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    out = mod(x)
    out = out[0] if isinstance(out, tuple) else out
    t1 = time.perf_counter()
    out.backward(g)
    t2 = time.perf_counter()
    return 1e3 * (t1 - t0), 1e3 * (t2 - t1)


def interleaved_rounds(
    calls: dict[str, Callable[[], tuple[float, ...]]], *, rounds: int, warmup: int
) -> tuple[dict[str, list[tuple[float, ...]]], list[float]]:
    """Run every call once per round in a rotated order; also time one GEMM per round (GFLOP/s)."""
    a, b = torch.randn(GEMM, GEMM), torch.randn(GEMM, GEMM)
    names = list(calls)
    times: dict[str, list[tuple[float, ...]]] = {k: [] for k in names}
    rates: list[float] = []
    for r in range(warmup + rounds):
        t0 = time.perf_counter()
        a @ b
        rate = 2 * GEMM**3 / (time.perf_counter() - t0) / 1e9
        for k in names[r % len(names) :] + names[: r % len(names)]:
            res = calls[k]()
            if r >= warmup:
                times[k].append(res)
        if r >= warmup:
            rates.append(rate)
    return times, rates


def _summary(samples: list[tuple[float, ...]]) -> dict:
    tot = [sum(s) for s in samples]
    med = statistics.median(tot)
    out = {"ms": med, "spread": (max(tot) - min(tot)) / med, "rounds": len(tot)}
    if len(samples[0]) == 2:
        out["fwd_ms"] = statistics.median(s[0] for s in samples)
        out["bwd_ms"] = statistics.median(s[1] for s in samples)
    return out


def time_case(
    regime_name: str, n: int, impls: tuple[str, ...], *, rounds: int, warmup: int, quick: bool
) -> dict:
    """Interleaved rounds of every implementation at one (regime, n): medians, spreads, per-round ratios."""
    regime = _regime(regime_name, quick)
    torch.manual_seed(0)
    x = torch.randn(1, n, regime["h"] * regime["d"], requires_grad=True)
    g = torch.randn(1, n, regime["h"] * regime["d"])
    calls, errors = {}, {}
    for impl in tuple(impls):
        if impl == "sdpa" and n > MAX_SDPA_N:
            errors[impl] = f"skipped: n > {MAX_SDPA_N} (O(n²) time)"
            continue
        try:
            mod = build_module(impl, regime, n)
        except (ValueError, ImportError, SystemExit) as err:
            errors[impl] = str(err)
            continue
        calls[impl] = lambda mod=mod: _fwd_bwd(mod, x, g)
    times, rates = interleaved_rounds(calls, rounds=rounds, warmup=warmup)
    res = {impl: _summary(t) for impl, t in times.items()}
    res.update({impl: {"error": msg} for impl, msg in errors.items()})
    if "nystrom" in times:
        ours = [sum(s) for s in times["nystrom"]]
        for impl, t in times.items():
            if impl != "nystrom":
                res[impl]["speedup"] = statistics.median(sum(s) / o for s, o in zip(t, ours))
    return {"results": res, "gemm_gflops": statistics.median(rates)}


def memory_case(impl: str, regime_name: str, n: int, *, quick: bool) -> dict:
    """Peak resident memory (MB) of the first forward + backward of one implementation."""
    regime = _regime(regime_name, quick)
    torch.manual_seed(0)
    try:
        mod = build_module(impl, regime, n)
    except (ValueError, ImportError, SystemExit) as err:
        return {"error": str(err)}
    x = torch.randn(1, n, regime["h"] * regime["d"], requires_grad=True)
    g = torch.randn(1, n, regime["h"] * regime["d"])
    return {"peak_mb": peak_memory_mb(lambda: _fwd_bwd(mod, x, g))}


def listops_case(*, rounds: int, warmup: int, quick: bool) -> dict:
    batch, length = (2, 64) if quick else (32, 2000)
    calls = {a: listops_step(a, batch=batch, length=length) for a in ("nystrom", "lucidrains")}
    times, _ = interleaved_rounds(calls, rounds=rounds, warmup=warmup)
    res = {a: _summary(t) for a, t in times.items()}
    res["lucidrains"]["speedup"] = statistics.median(
        t[0] / o[0] for t, o in zip(times["lucidrains"], times["nystrom"])
    )
    return {"batch": batch, "length": length, "results": res}


CASES = {"time": time_case, "memory": memory_case, "listops": listops_case}


def measure(case: dict) -> dict:
    """One case of kind ``case["kind"]`` (a key of :data:`CASES`; the rest are its options)."""
    spec = dict(case)
    return CASES[spec.pop("kind")](**spec)


def _case(kind: str, quick: bool, env: dict[str, str], **spec) -> dict:
    """A case in a fresh process under ``env`` (in this one under ``quick``)."""
    if quick:
        return CASES[kind](**spec, quick=True)
    case = {"kind": kind, **spec, "quick": False}
    return run_case("nystrom_lab.bench.training.driver:measure", case, timeout_s=3600, env=env)


def run(
    *,
    quick: bool = False,
    regimes: tuple[str, ...] = tuple(REGIMES),
    impls: tuple[str, ...] = IMPLS,
    rounds: int | None = None,
    warmup: int | None = None,
    listops: bool = True,
    out_dir: Path = Path("runs/bench"),
    markdown: Path | None = Path("runs/bench/benchmarks.md"),
    command: str = "nystrom bench training",
    malloc: str = "system",
) -> dict:
    """Every (regime, n): interleaved timing + per-implementation peak memory; the ListOps step; report.

    ``malloc``: ``"system"`` or ``"cached"`` (``common.MALLOC``: the children's allocator keeps freed
    memory); a cached run writes ``bench_training_cached.json``, ``training_cached.png`` and its own
    section of the markdown, beside the system run's.
    """
    from tqdm import tqdm

    env = malloc_env(malloc)
    if env and quick:
        raise ValueError(f"--malloc {malloc} needs fresh processes; --quick runs in this one")
    suffix = "" if malloc == "system" else f"_{malloc}"
    rounds = rounds or (1 if quick else 5)
    warmup = (0 if quick else 3) if warmup is None else warmup
    start = time.perf_counter()
    cases = [(r, n) for r in regimes for n in _regime(r, quick)["lengths"]]
    rows: list[dict] = []
    floors: list[dict] = []
    bar = tqdm(total=len(cases) * (1 + len(impls)) + listops, desc="training bench", disable=quick)
    for reg, n in cases:
        timed = _case(
            "time", quick, env, regime_name=reg, n=n, impls=list(impls), rounds=rounds, warmup=warmup
        )
        bar.update()
        results = timed.get("results", {i: {"error": timed.get("error", "no result")} for i in impls})
        for impl in impls:
            row = {"regime": reg, "n": n, "impl": impl, **results.get(impl, {})}
            if "error" not in row:
                row.update(_case("memory", quick, env, impl=impl, regime_name=reg, n=n))
            bar.update()
            rows.append(row)
        if "gemm_gflops" in timed:
            rate = timed["gemm_gflops"]
            floor = attention_layer_training_floor_ms(_regime(reg, quick), n, rate)
            floors.append({"regime": reg, "n": n, "gflops": rate, "floor_ms": floor})
    steps = _case("listops", quick, env, rounds=rounds, warmup=warmup) if listops else None
    bar.update(int(listops))
    bar.close()
    info = {**machine_info(), "seconds": f"{time.perf_counter() - start:.0f}", "command": command}
    info["allocator"] = allocator_info(env)
    if quick:
        info["note"] = "; --quick: toy sizes, one process"
    data = {
        "info": info,
        "rows": rows,
        "floors": floors,
        "listops": steps,
        "regimes": QUICK if quick else REGIMES,
    }
    text = report(data, suffix=suffix)
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"bench_training{suffix}.json").write_text(json.dumps(data, indent=1))
    plot(data, out_dir / f"training{suffix}.png", malloc=malloc)
    if markdown is not None:
        replace_section(markdown, f"bench-training{suffix.replace('_', '-')}", text)
    return data
