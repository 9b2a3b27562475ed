"""Markdown report of ``nystrom bench core`` (see :mod:`nystrom_lab.bench.core.driver`).

Legend: b batch, h heads, n tokens, m landmarks, d head dim.

Torch-free on purpose: ``nystrom docs render`` rebuilds the report from the committed
``bench_attention.csv`` (rows) and ``bench_attention.json`` (machine and settings) with this same writer.
"""

from __future__ import annotations

from nystrom_lab.bench.floors import attention_core_floor_ms

IMPLS = ("nystrom", "hf", "lucidrains", "sdpa")
MODES = ("core", "fwd", "fwdbwd")
_TITLES = {
    "core": "Attention core (q, k, v given; no projections), forward",
    "fwd": "Whole module forward (no_grad)",
    "fwdbwd": "Whole module forward + backward",
}


def render(rows: list[dict], info: dict, *, heads: int, dim_head: int, landmarks: int, dtype: str) -> str:
    """Markdown: per mode a table of ms / MB and our speed-up and memory ratio vs each other implementation.

    ``info``: :func:`nystrom_lab.bench.measure.machine_info` plus the run's GEMM rate before and after
    (``gemm_gflops_before`` / ``_after``); a core row without its own interleaved rate takes the larger."""
    rate = max(float(info["gemm_gflops_before"]), float(info["gemm_gflops_after"]))
    get = {(r["impl"], r["mode"], r["n"]): r for r in rows}
    lengths = sorted({r["n"] for r in rows})
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    lines = [
        f"Machine: {info['cpu']}, {info['threads']} threads; torch {info['torch']}, transformers "
        f"{info['transformers']}, nystrom-attention {info['nystrom_attention']}, Python {info['python']}.",
        f"b=1, h={heads}, d={dim_head}, m={landmarks}, {dtype}, conv off. Floor = 8·n·m·d·h FLOPs over the "
        "large fp32 GEMM rate timed alternately with our core in its process (column GEMM); the run's rate: "
        f"{info['gemm_gflops_before']} GFLOP/s before, {info['gemm_gflops_after']} after.",
        "Speed-up = their time / ours (>1: we are faster); memory = our peak / theirs (<1: we use less).",
        "",
    ]
    for mode in (m for m in MODES if any(r["mode"] == m for r in rows)):
        lines += [f"### {_TITLES[mode]}", ""]
        others = [i for i in impls if i != "nystrom"]
        head = ["n", *(f"{i} ms" for i in impls), *(f"{i} MB" for i in impls)]
        head += [f"speed-up vs {i}" for i in others] + [f"mem vs {i}" for i in others]
        if mode == "core":
            head += ["GEMM GFLOP/s", "floor ms", "ours / floor"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for n in lengths:
            res = {i: get.get((i, mode, n), {}) for i in impls}
            cells = [str(n)]
            cells += [f"{res[i]['ms']:.1f}" if "ms" in res[i] else "—" for i in impls]
            cells += [f"{res[i]['peak_mb']:.0f}" if "peak_mb" in res[i] else "—" for i in impls]
            ours = res.get("nystrom", {})
            for key in ("ms", "peak_mb"):
                for i in others:
                    if ours.get(key, 0) > 0 and res[i].get(key, 0) > 0:
                        ratio = res[i][key] / ours[key] if key == "ms" else ours[key] / res[i][key]
                        cells.append(f"{ratio:.2f}×")
                    else:
                        cells.append("—")
            if mode == "core":
                r = ours.get("gemm_gflops", rate)
                floor = attention_core_floor_ms(
                    n, landmarks=landmarks, dim_head=dim_head, heads=heads, gflops=r
                )
                cells += [f"{r:.1f}", f"{floor:.1f}", f"{ours['ms'] / floor:.2f}×" if "ms" in ours else "—"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
