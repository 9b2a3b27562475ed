"""Host time of one ``nystrom_attention`` call on the meta device: the Python, dispatch and allocations a
GPU's host runs per call (on meta the op's fake kernel stands in for the launches, which cost the host a
few µs each on top).

Legend: b batch, h heads, n tokens, d head dim, m landmarks.

``python -m nystrom_lab.bench.launches.host_time [--rounds 5] [--calls 300]`` prints a JSON line per case
(bf16, b = 1, h = 8, n = 4096, d = 64, m = 64; no mask and a mask of ones; forward, and forward +
backward): the median over rounds of the µs per call. To compare two versions in one run, alternate it
with ``PYTHONPATH=<the other checkout>/src`` (docs/fused_kernels.md, "Host time").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SHAPE = {"b": 1, "h": 8, "n": 4096, "d": 64, "m": 64}


def host_us(*, masked: bool, backward: bool, calls: int) -> float:
    """Mean µs of host time per call over ``calls`` calls (after warm-up calls that build any cache)."""
    from nystrom import nystrom_attention

    b, h, n, d, m = (SHAPE[k] for k in "bhndm")
    q, k, v = (torch.empty(b, h, n, d, device="meta", dtype=torch.bfloat16, requires_grad=backward)
               for _ in range(3))  # fmt: skip
    mask = torch.ones(b, n, dtype=torch.bool, device="meta") if masked else None
    grad = torch.empty(b, h, n, d, device="meta", dtype=torch.bfloat16)

    def call() -> None:
        out = nystrom_attention(q, k, v, num_landmarks=m, mask=mask)
        if backward:
            out.backward(grad)

    for _ in range(20):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nystrom_lab.bench.launches.host_time", description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=300)
    a = p.parse_args(argv)
    for masked in (False, True):
        for backward in (False, True):
            us = [host_us(masked=masked, backward=backward, calls=a.calls) for _ in range(a.rounds)]
            print(json.dumps({"mask": masked, "backward": backward, "us_median": round(statistics.median(us), 1),
                              "us_rounds": [round(x, 1) for x in us], **SHAPE}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
