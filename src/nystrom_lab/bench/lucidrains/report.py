"""Markdown table of ``python -m nystrom_lab.bench.lucidrains`` (our compat layer against lucidrains'
nystrom-attention on TransMIL's layer), torch-free so that ``nystrom docs render`` writes docs/lucidrains.md's
table from the committed JSON with it.

A row: ``setting``, ``n`` and cosine similarities over the whole output: ``ours_vs_theirs``,
``per_matrix_vs_theirs``, ``theirs_masked_vs_unmasked``, ``ours_vs_theirs_masked``, ``theirs_vs_exact``,
``ours_vs_exact``; ``worst_row_err``: the worst token's ‖ours − theirs‖ / ‖theirs‖.
"""

from __future__ import annotations

LANDMARKS = 256


def _err(x: float) -> str:
    """A relative error: 3 decimals, or 2 significant digits in e-notation below 0.01 (``6.4e-4``)."""
    return f"{x:.3f}" if x >= 0.01 else f"{x:.1e}".replace("e-0", "e-")


def render(rows: list[dict]) -> str:
    """One row per (setting, n), columns as the module docstring lists them."""
    out = [
        "| setting | n | n mod 256 | ours vs lucidrains | ours `per_matrix` vs lucidrains | lucidrains masked vs "
        "unmasked | ours vs lucidrains masked | cos to exact softmax: lucidrains / ours | worst token rel. err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['setting']} | {r['n']} | {r['n'] % LANDMARKS} | {r['ours_vs_theirs']:.6f} | "
            f"{r['per_matrix_vs_theirs']:.6f} | {r['theirs_masked_vs_unmasked']:.6f} | {r['ours_vs_theirs_masked']:.7f} | "
            f"{r['theirs_vs_exact']:.4f} / {r['ours_vs_exact']:.4f} | {_err(r['worst_row_err'])} |"
        )
    return "\n".join(out)
