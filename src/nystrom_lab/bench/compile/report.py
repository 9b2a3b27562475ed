"""Markdown table of ``python -m nystrom_lab.bench.compile`` (eager vs ``torch.compile``), torch-free so
that ``nystrom docs render`` writes docs/benchmarks.md's table from the committed JSON with it.

A row: ``n``, ``pass`` (``fwd`` or ``fwd+bwd``), ``eager`` and ``compiled`` as ``[median, min, max]`` ms,
``speedup`` (eager median ÷ compiled median, from the unrounded times) and ``compile_s`` (first call).
"""

from __future__ import annotations


def render(rows: list[dict]) -> str:
    """One row per (n, pass): eager and compiled ms with their spread, the ratio and the compile time."""
    out = [
        "| n | pass | eager ms (min–max) | compiled ms (min–max) | eager / compiled | compile s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        (e, e_lo, e_hi), (c, c_lo, c_hi) = r["eager"], r["compiled"]
        out.append(
            f"| {r['n']} | {r['pass']} | {e:.0f} ({e_lo:.0f}–{e_hi:.0f}) | {c:.0f} ({c_lo:.0f}–{c_hi:.0f}) "
            f"| {r['speedup']:.2f}× | {r['compile_s']:.0f} |"
        )
    return "\n".join(out)
