"""Blocks of docs/cpu.md (bf16 on AVX2-only CPUs): whole models per instruction set and dtype, the speed before and
after the capability check, and bf16's accuracy against fp32 per ISA branch.

Data: ``docs/cpu/<isa>_<dtype>/bench_models.json`` (``nystrom bench models``, 4096 tokens, batch 1,
inference; ``avx2`` runs limited with ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``),
``docs/cpu/ab/{old,new}_<dtype>_<i>.json`` (the same suite before and after the check, alternating) and
``docs/cpu/cpu_paths*.json`` (``scripts/cpu_paths.py``).
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.bench.models.report import cases, compare_table
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_json

DOC = "docs/cpu.md"
MODELS = ("ours-nystrom", "ours-softmax", "hf-nystromformer", "hf-bert")
RUNS = (
    ("AVX-512 (native)", "fp32", "avx512_float32"),
    ("AVX-512 (native)", "bf16", "avx512_bfloat16"),
    ("AVX2 (limited)", "fp32", "avx2_float32"),
    ("AVX2 (limited)", "bf16, plain bf16 GEMMs (f953c74)", "avx2_bfloat16_plain"),
    ("AVX2 (limited)", "bf16, linears in fp32 (now)", "avx2_bfloat16"),
)
AB = tuple(f"docs/cpu/ab/{when}_{dtype}_{i}.json" for dtype in ("float32", "bfloat16") for i in (1, 2)
           for when in ("old", "new"))  # fmt: skip


def machine(first_run: Path) -> str:
    """The line naming the machine and versions of the runs."""
    m = read_json(first_run)["machine"]
    return (
        f"Machine: {m['cpu']}, {m['threads']} threads, torch {m['torch']}, transformers {m['transformers']}."
    )


def models(*paths: Path) -> str:
    """One row per (ISA, dtype) run, a column per model: seconds (peak MB) at 4096 tokens."""
    lines = []
    for (isa, dtype, _), path in zip(RUNS, paths):
        run = read_json(path)
        lines.append(([isa, dtype], cases(run, "inference", 4096)))
    return compare_table(["ISA", "dtype"], lines, models=MODELS)


def before_after(*paths: Path) -> str:
    """Ours and HF's Nystromformer in the same run, before (``old``) and after (``new``) the check."""
    out = [
        "| dtype | run | code | ours s | HF Nystromformer s | HF ÷ ours |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for path in paths:
        when, dtype, i = path.stem.split("_")
        rows = cases(read_json(path), "inference", 4096)
        ours, hf = rows["ours-nystrom"]["median_s"], rows["hf-nystromformer"]["median_s"]
        code = "before (8e9420d)" if when == "old" else "after (f953c74)"
        out.append(
            f"| {'bf16' if dtype == 'bfloat16' else 'fp32'} | {i} | {code} | {ours:.2f} | {hf:.2f} | {hf / ours:.2f}× |"
        )
    return "\n".join(out)


def accuracy(plain: Path, after: Path) -> str:
    """bf16 against fp32 of the same long MiniLM encoder per ISA: time and the token states' distance."""
    out = ["| ISA | bf16 linears | fp32 s | bf16 autocast s | bf16 weights s | autocast: max abs Δ, mean / min cos | weights: max abs Δ, mean / min cos |",
           "|---|---|---:|---:|---:|---|---|"]  # fmt: skip
    rows = [("AVX-512", "bf16 oneDNN", read_json(after)["runs"]["native"]),
            ("AVX2", "plain bf16 GEMMs (f953c74)", read_json(plain)["runs"]["avx2"]),
            ("AVX2", "fp32 GEMM, rounded (now)", read_json(after)["runs"]["avx2"])]  # fmt: skip
    for isa, how, r in rows:
        cells = [f"{r[k]:.2f}" for k in ("fp32_s", "bf16_autocast_s", "bf16_weights_s")]
        for k in ("bf16_autocast_vs_fp32", "bf16_weights_vs_fp32"):
            d = r[k]
            cells.append(f"{d['max_abs']:.3f}, {d['mean_cos']:.5f} / {d['min_cos']:.5f}")
        out.append(f"| {isa} | {how} | " + " | ".join(cells) + " |")
    return "\n".join(out)


BLOCKS = [
    Block(DOC, "cpu-machine", ("docs/cpu/avx512_float32/bench_models.json",), machine, inline=True),
    Block(DOC, "cpu-models", tuple(f"docs/cpu/{d}/bench_models.json" for _, _, d in RUNS), models),
    Block(DOC, "cpu-before-after", AB, before_after),
    Block(DOC, "cpu-accuracy", ("docs/cpu/cpu_paths_plain.json", "docs/cpu/cpu_paths.json"), accuracy),
]
