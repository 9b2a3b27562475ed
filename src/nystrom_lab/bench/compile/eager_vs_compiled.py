"""What ``torch.compile`` buys NystromAttention on CPU: eager vs compiled, forward and forward+backward.

Run: ``python -m nystrom_lab.bench.compile`` (a few minutes on 2 cores: each compile takes tens of seconds).
Module: NystromAttention(512, heads=8, dim_head=64) with its default landmarks and conv, batch 1, float32.
Eager runs our fused CPU kernels from n = 16384 in inference and from ``kernels.TRAIN_MIN_N`` (131072) with
autograd, SDPA below; compiled code runs the traceable path (SDPA for both products, the conv as fused
shifted adds). Prints median and min–max of ``REPEATS``
timed calls after two warm-up calls, and the compile time (first call); with a path argument also writes
the rows as JSON there (docs/bench_compile.json is what ``nystrom docs render`` makes the docs table of).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import torch

from nystrom.attention import NystromAttention
from nystrom_lab.bench.compile.report import render
from nystrom_lab.bench.measure import call_times_s

LENGTHS = (4096, 16384)
REPEATS = 7


def _time(fn) -> tuple[float, float, float, float]:
    """Median, min and max seconds of ``REPEATS`` calls after one more warm-up, and the first call's."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = call_times_s(fn, repeats=REPEATS, warmup=1)
    return statistics.median(times), min(times), max(times), first


def main(out: Path | None = None) -> None:
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, threads {torch.get_num_threads()}"
    )
    rows = []
    for n in LENGTHS:
        torch.manual_seed(0)
        mod = NystromAttention(512, heads=8, dim_head=64).eval()
        x = torch.randn(1, n, 512)
        xg = x.clone().requires_grad_(True)
        compiled = torch.compile(mod)

        def fwd(m=mod):
            with torch.no_grad():
                m(x)

        def fwd_bwd(m=mod):
            m(xg).sum().backward()

        for name, step in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
            e_med, e_lo, e_hi, _ = _time(step)
            c_med, c_lo, c_hi, first = _time(lambda step=step: step(compiled))
            rows.append({"n": n, "pass": name, "eager": [1e3 * e_med, 1e3 * e_lo, 1e3 * e_hi],
                         "compiled": [1e3 * c_med, 1e3 * c_lo, 1e3 * c_hi], "speedup": e_med / c_med,
                         "compile_s": first})  # fmt: skip
        torch._dynamo.reset()
    print(render(rows))
    if out is not None:
        out.write_text(json.dumps({"source": f"python -m nystrom_lab.bench.compile, torch {torch.__version__}",
                                   "rows": rows}, indent=1) + "\n")  # fmt: skip

