"""Blocks made by ``nystrom bench models`` (whole encoders) and by the GPU runs: the comparison tables of
docs/benchmarks.md, each run's own report (``docs/**/bench_models.md``) and the GPU attention tables.

Legend: n tokens, b batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from nystrom_lab.bench.models import MODELS
from nystrom_lab.bench.models_report import cases, compare_table, render
from nystrom_lab.bench.table1_report import num
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_csv, read_json

DOC = "docs/benchmarks.md"
RUNS = ("bench_models", "bench_b4/bench_models", "bench_base/bench_models", "bench_bf16/bench_models",
        "bench_inference/bench_models", "bench_inference4096/bench_models")  # fmt: skip


def report(path: Path) -> str:
    """A run's own report (the file ``nystrom bench models`` writes beside its JSON)."""
    return render(read_json(path))


def inference(session12: Path, idle4096: Path) -> str:
    """Session 12's inference run, with the idle 5-round run at 4096 as a row of its own."""
    run, idle = read_json(session12), read_json(idle4096)
    lines = []
    for n in sorted({r["n"] for r in run["rows"] if r["mode"] == "inference"}):
        lines.append(([str(n)], cases(run, "inference", n)))
        if n == 4096:
            lines.append((["4096, idle, 5 rounds"], cases(idle, "inference", n)))
    return compare_table(["inference: s (peak MB)"], lines, models=MODELS)


def training(path: Path) -> str:
    """Session 11's training steps, one row per length."""
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
    """bf16 autocast: session 12's inference run and session 11's training step at 4096."""
    inf, train = read_json(inference_run), read_json(train_run)
    ns = sorted({r["n"] for r in inf["rows"]})
    first = compare_table(
        ["bf16 inference: s (peak MB)"], [([str(n)], cases(inf, "inference", n)) for n in ns], models=MODELS
    )
    second = compare_table(
        ["bf16 training step: s (peak MB)"], [(["4096"], cases(train, "train", 4096))], models=MODELS
    )
    return f"{first}\n\n{second}"


GPU_LABELS = {
    "ours-nystrom": "ours Nyström-64",
    "ours-softmax": "ours exact (SDPA)",
    "hf-bert": "HF BERT (SDPA)",
}


def gpu_models(path: Path) -> str:
    """Whole models on the H100, inference and a training step, in ms."""
    run = read_json(path)
    models = tuple(m for m in MODELS if any(r["model"] == m for r in run["rows"]))
    lines = [([label, str(n)], cases(run, mode, n)) for mode, label in (("inference", "inference"), ("train", "train step"))
             for n in sorted({r["n"] for r in run["rows"] if r["mode"] == mode})]  # fmt: skip
    return compare_table(["ms (peak MB)", "n"], lines, models=models, ms=True, labels=GPU_LABELS)


def _by(rows: list[dict], method: str) -> dict[int, dict]:
    """One method's rows by n."""
    return {r["n"]: r for r in rows if r["method"] == method}


def _skipped(row: dict) -> str:
    """A case not run for its memory, as the size it would need: ``(128 GB)``."""
    need = re.search(r"~([\d.]+) GB", row.get("skipped", ""))
    return f"({float(need.group(1)):g} GB)" if need else "—"


def _ms(row: dict | None) -> str:
    """A time cell; ``—`` for a case without one (skipped, failed, not run)."""
    return num(row["ms"]) if row and "ms" in row else "—"


#: the outside modules of issue #36's run, in the GPU tables where their CSV rows hold a time
GPU_EXTRA = {"hf-nystrom-64": "transformers Nyström-64", "lucidrains-64": "lucidrains Nyström-64",
             "transmil": "TransMIL layer, ours (m = 256)", "transmil-lucidrains": "TransMIL layer, lucidrains (m = 256)"}  # fmt: skip


def _gpu_attention_table(title: str, rows: list[dict]) -> list[str]:
    """SDPA against Nyström (and the materialised softmax) per n, one precision and pass; the outside
    modules (transformers', lucidrains', the TransMIL layer) in ms / MB where they ran."""
    sdpa, nys, full = _by(rows, "sdpa"), _by(rows, "nystrom-64"), _by(rows, "transformer")
    ns = sorted(sdpa)
    both = {n: "ms" in sdpa[n] and "ms" in nys.get(n, {}) for n in ns}
    speed = {n: sdpa[n]["ms"] / nys[n]["ms"] for n in ns if both[n]}
    mb = {n: f"{sdpa[n]['peak_mb']:.0f} / {nys[n]['peak_mb']:.0f}" if both[n] else "—" for n in ns}
    out = [f"| {title} | " + " | ".join(f"n = {n}" if i == 0 else str(n) for i, n in enumerate(ns)) + " |",
           "|---|" + "---:|" * len(ns),
           "| SDPA (exact, fused) ms | " + " | ".join(_ms(sdpa[n]) for n in ns) + " |",
           "| Nyström-64 ms | " + " | ".join(_ms(nys.get(n)) for n in ns) + " |",
           "| Nyström ÷ SDPA speed-up | " + " | ".join(
               "—" if n not in speed else f"**{speed[n]:.1f}×**" if speed[n] > 1 else f"{speed[n]:.2f}×" for n in ns) + " |",
           "| SDPA / Nyström peak MB | " + " | ".join(mb[n] for n in ns) + " |",
           "| materialised softmax ms / MB | " + " | ".join(
               f"{num(full[n]['ms'])} / {full[n]['peak_mb']:.0f}" if "ms" in full.get(n, {}) else _skipped(full.get(n, {}))
               for n in ns) + " |"]  # fmt: skip
    for method, label in GPU_EXTRA.items():
        got = _by(rows, method)
        if any("ms" in r for r in got.values()):
            out.append(f"| {label} ms / MB | " + " | ".join(
                f"{num(got[n]['ms'])} / {got[n]['peak_mb']:.0f}" if "ms" in got.get(n, {}) else "—" for n in ns) + " |")  # fmt: skip
    return out


def gpu_attention(bf16_fwd: Path, bf16_fwdbwd: Path, fp16_fwd: Path, fp32_fwd: Path) -> str:
    """Table 1's modules on the GPU: bf16 forward and forward + backward, the forward in fp16 and fp32."""
    out = [*_gpu_attention_table("bf16, forward", read_csv(bf16_fwd)), ""]
    out += [*_gpu_attention_table("bf16, forward + backward", read_csv(bf16_fwdbwd)), ""]
    others = {"fp16": read_csv(fp16_fwd), "fp32": read_csv(fp32_fwd)}
    ns = sorted(_by(others["fp16"], "sdpa"))
    out += ["| forward, other precisions | " + " | ".join(f"n = {n}" if i == 0 else str(n) for i, n in enumerate(ns)) + " |",
            "|---|" + "---:|" * len(ns)]  # fmt: skip
    for name, rows in others.items():
        sdpa, nys = _by(rows, "sdpa"), _by(rows, "nystrom-64")
        out.append(f"| {name}: SDPA / Nyström ms | " + " | ".join(f"{_ms(sdpa.get(n))} / {_ms(nys.get(n))}" for n in ns) + " |")  # fmt: skip
        hf = _by(rows, "hf-nystrom-64")
        if any("ms" in r for r in hf.values()):
            out.append(f"| {name}: transformers Nyström-64 ms | " + " | ".join(_ms(hf.get(n)) for n in ns) + " |")  # fmt: skip
    return "\n".join(out)


GPU_GRAPHED_LABELS = {**GPU_LABELS, "ours-nystrom-graphed": "ours Nyström-64, CUDA graph",
                      "ours-nystrom-compiled": "ours Nyström-64, compile (reduce-overhead)"}  # fmt: skip


def gpu_models_graphed(path: Path) -> str:
    """Our Nyström model eager, replayed as a CUDA graph and compiled, against ours SDPA and transformers'
    Nystromformer, in ms; a case that did not run is ``—`` (its reason is in the JSON)."""
    from nystrom_lab.bench.models import ALL_MODELS

    run = read_json(path)
    if not run["rows"]:  # the placeholder committed before the first GPU run
        return "Not measured yet: `scripts/gpu_bench.sh` on a lent GPU writes its data (issue #36)."
    models = tuple(m for m in ALL_MODELS if any(r["model"] == m for r in run["rows"]))
    lines = [([label, str(n)], cases(run, mode, n)) for mode, label in (("inference", "inference"), ("train", "train step"))
             for n in sorted({r["n"] for r in run["rows"] if r["mode"] == mode})]  # fmt: skip
    table = compare_table(["ms (peak MB)", "n"], lines, models=models, ms=True, labels=GPU_GRAPHED_LABELS)
    why = sorted({f"{r['model']} {r['mode']} n={r['n']}: {r.get('skipped') or r.get('error')}" for r in run["rows"]
                  if "median_s" not in r})  # fmt: skip
    return table + ("\n\nNot measured: " + "; ".join(why) + "." if why else "")


BLOCKS = [
    *(Block(f"docs/{run}.md", "bench-models", (f"docs/{run}.json",), report) for run in RUNS),
    Block(DOC, "bench-models-inference", ("docs/bench_inference/bench_models.json", "docs/bench_inference4096/bench_models.json"), inference),
    Block(DOC, "bench-models-training", ("docs/bench_models.json",), training),
    Block(DOC, "bench-models-b4", ("docs/bench_b4/bench_models.json",), one_length("b = 4, n = 4096: s (peak MB)", 4)),
    Block(DOC, "bench-models-base", ("docs/bench_base/bench_models.json",), one_length("base, n = 4096: s (peak MB)", 1)),
    Block(DOC, "bench-models-bf16", ("docs/bench_bf16/bench_models.json", "docs/bench_models_bf16_train4096.json"), bf16),
    Block(DOC, "gpu-attention", tuple(f"docs/gpu/table1_{t}.csv" for t in ("bfloat16_fwd", "bfloat16_fwdbwd", "float16_fwd", "float32_fwd")), gpu_attention),
    Block(DOC, "gpu-models", ("docs/gpu/bench_models_gpu.json",), gpu_models),
    Block(DOC, "gpu-models-graphed", ("docs/gpu/bench_models_gpu_graphed.json",), gpu_models_graphed),
]  # fmt: skip
