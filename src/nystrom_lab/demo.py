"""`nystrom demo`: a one-minute tour — correctness checks against exact attention and a quick timing.

Legend: b batch, h heads, n tokens, m landmarks, d head dim.
"""

from __future__ import annotations

import torch

from nystrom.functional import nystrom_attention, softmax_attention
from nystrom_lab.attention_spec import constructor_default
from nystrom_lab.bench.measure import median_time_ms


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def correctness(*, seed: int = 0) -> list[str]:
    """Three checks in float64, returned as printable lines; raises AssertionError if one fails."""
    g = torch.Generator().manual_seed(seed)
    lines = []
    q, k, v = (torch.randn(2, 4, 96, 16, generator=g, dtype=torch.float64) for _ in range(3))
    exact = softmax_attention(q, k, v)
    err = _rel(nystrom_attention(q, k, v, num_landmarks=96, pinv="exact"), exact)
    lines.append(f"m = n with exact pinv vs softmax attention: relative error {err:.1e}")
    assert err < 1e-9, err
    u = torch.randn(1, 4, 1024, 4, generator=g, dtype=torch.float64)  # low-rank-plus-noise inputs
    q = u @ torch.randn(4, 32, generator=g, dtype=torch.float64) * 0.4 + 0.05 * torch.randn(
        1, 4, 1024, 32, generator=g
    )
    k = u @ torch.randn(4, 32, generator=g, dtype=torch.float64) * 0.4 + 0.05 * torch.randn(
        1, 4, 1024, 32, generator=g
    )
    v = torch.randn(1, 4, 1024, 32, generator=g, dtype=torch.float64)
    exact = softmax_attention(q, k, v)
    errs = {m: _rel(nystrom_attention(q, k, v, num_landmarks=m), exact) for m in (8, 32, 128, 512)}
    lines.append(
        "approximation error vs landmarks (n=1024): " + ", ".join(f"m={m}: {e:.3f}" for m, e in errs.items())
    )
    L = 700
    mask = torch.arange(1024)[None] < L
    padded = nystrom_attention(q, k, v, num_landmarks=32, mask=mask)[..., :L, :]
    alone = nystrom_attention(q[..., :L, :], k[..., :L, :], v[..., :L, :], num_landmarks=32)
    err = _rel(padded, alone)
    lines.append(f"right-padded (700 of 1024 real) vs unpadded: relative difference {err:.1e}")
    assert err < 1e-12, err
    return lines


def timing(
    lengths: tuple[int, ...] = (1024, 4096, 16384), *, heads: int = 8, dim_head: int = 64
) -> list[str]:
    """Forward time of the Nyström core (NystromAttention's default landmarks) vs exact fused softmax
    (SDPA), fp32, b=1."""
    m = constructor_default("nystrom", "num_landmarks")
    lines = [f"{'n':>7} {f'nystrom-{m} ms':>14} {'softmax ms':>11} {'speed-up':>9}"]
    for n in lengths:
        q, k, v = (torch.randn(1, heads, n, dim_head) for _ in range(3))
        t_ny = median_time_ms(lambda: nystrom_attention(q, k, v, num_landmarks=m), repeats=3, budget_s=5)
        t_sm = median_time_ms(lambda: softmax_attention(q, k, v), repeats=3, budget_s=5)
        lines.append(f"{n:>7} {t_ny:>14.1f} {t_sm:>11.1f} {t_sm / t_ny:>8.1f}×")
    return lines


def main(*, quick: bool = False) -> int:
    torch.set_printoptions(precision=4)
    print("== correctness (float64) ==")
    for line in correctness():
        print("  " + line)
    print(f"== timing (fp32, {torch.get_num_threads()} threads; h=8, d=64) ==")
    for line in timing((1024, 4096) if quick else (1024, 4096, 16384)):
        print("  " + line)
    print("All checks passed. Full benchmarks: `nystrom bench` and `nystrom bench core` (write runs/bench/).")
    return 0
