"""Blocks made by ``nystrom bench models`` (whole encoders) on the CPU: the comparison tables of
docs/benchmarks.md and each run's own report (``docs/**/bench_models.md``); the GPU run's tables are in
:mod:`nystrom_lab.docs.blocks_gpu`.

Legend: n tokens, b batch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nystrom_lab.bench.models.cases import MODELS
from nystrom_lab.bench.models.report import cases, compare_table, render
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_json

DOC = "docs/benchmarks.md"
RUNS = ("bench_models", "bench_b4/bench_models", "bench_base/bench_models", "bench_bf16/bench_models",
        "bench_inference/bench_models", "bench_inference4096/bench_models")  # fmt: skip


def report(path: Path) -> str:
    """A run's own report (the file ``nystrom bench models`` writes beside its JSON)."""
    return render(read_json(path))


def inference(main_run: Path, idle4096: Path) -> str:
    """The inference run (after the fused linears), with the idle 5-round run at 4096 as a row of its own."""
    run, idle = read_json(main_run), read_json(idle4096)
    lines = []
    for n in sorted({r["n"] for r in run["rows"] if r["mode"] == "inference"}):
        lines.append(([str(n)], cases(run, "inference", n)))
        if n == 4096:
            lines.append((["4096, idle, 5 rounds"], cases(idle, "inference", n)))
    return compare_table(["inference: s (peak MB)"], lines, models=MODELS)


def training(path: Path) -> str:
    """The 3-round training steps (before the fused linears, which a training step does not use), one row
    per length."""
    run = read_json(path)
    ns = sorted({r["n"] for r in run["rows"] if r["mode"] == "train"})
    return compare_table(
        ["training step: s (peak MB)"], [([str(n)], cases(run, "train", n)) for n in ns], models=MODELS
    )


def one_length(title: str, batch: int) -> Callable[[Path], str]:
    """Inference and a training step at 4096 tokens of one run (batch 4, BERT-base size)."""

    def table(path: Path) -> str:
        run = read_json(path)
        lines = [
            ([label], cases(run, mode, 4096, batch))
            for label, mode in (("inference", "inference"), ("training step", "train"))
        ]
        return compare_table([title], lines, models=MODELS)

    return table


def bf16(inference_run: Path, train_run: Path) -> str:
    """bf16 autocast: the inference run after the fused linears and a training step at 4096."""
    inf, train = read_json(inference_run), read_json(train_run)
    ns = sorted({r["n"] for r in inf["rows"]})
    first = compare_table(
        ["bf16 inference: s (peak MB)"], [([str(n)], cases(inf, "inference", n)) for n in ns], models=MODELS
    )
    second = compare_table(
        ["bf16 training step: s (peak MB)"], [(["4096"], cases(train, "train", 4096))], models=MODELS
    )
    return f"{first}\n\n{second}"


BLOCKS = [
    *(Block(f"docs/{run}.md", "bench-models", (f"docs/{run}.json",), report) for run in RUNS),
    Block(DOC, "bench-models-inference", ("docs/bench_inference/bench_models.json", "docs/bench_inference4096/bench_models.json"), inference),
    Block(DOC, "bench-models-training", ("docs/bench_models.json",), training),
    Block(DOC, "bench-models-b4", ("docs/bench_b4/bench_models.json",), one_length("b = 4, n = 4096: s (peak MB)", 4)),
    Block(DOC, "bench-models-base", ("docs/bench_base/bench_models.json",), one_length("base, n = 4096: s (peak MB)", 1)),
    Block(DOC, "bench-models-bf16", ("docs/bench_bf16/bench_models.json", "docs/bench_models_bf16_train4096.json"), bf16),
]  # fmt: skip
