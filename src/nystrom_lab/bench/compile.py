"""What ``torch.compile`` buys NystromAttention on CPU: eager vs compiled, forward and forward+backward.

Run: ``python -m nystrom_lab.bench.compile`` (a few minutes on 2 cores: each compile takes tens of seconds).
Module: NystromAttention(512, heads=8, dim_head=64) with its default landmarks and conv, batch 1, float32.
Eager runs our fused CPU kernels from n = 16384 (SDPA below); compiled code runs the traceable path
(SDPA for both products, the conv as fused shifted adds). Prints median and min–max of ``REPEATS``
timed calls after two warm-up calls, and the compile time (first call).
"""

from __future__ import annotations

import platform
import statistics
import time

import torch

from nystrom.attention import NystromAttention

LENGTHS = (4096, 16384)
REPEATS = 7


def _time(fn) -> tuple[float, float, float, float]:
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    fn()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times), first


def main() -> None:
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, threads {torch.get_num_threads()}")
    print("| n | pass | eager ms (min–max) | compiled ms (min–max) | eager / compiled | compile s |")
    print("|---|---|---|---|---|---|")
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
            print(
                f"| {n} | {name} | {e_med * 1e3:.0f} ({e_lo * 1e3:.0f}–{e_hi * 1e3:.0f}) "
                f"| {c_med * 1e3:.0f} ({c_lo * 1e3:.0f}–{c_hi * 1e3:.0f}) | {e_med / c_med:.2f}× | {first:.0f} |"
            )
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
