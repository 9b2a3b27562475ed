"""Tables of the GPU run committed in docs/gpu/: the attention modules and whole models of docs/benchmarks.md's
"On a GPU", and the real CUDA launches of docs/gpu/launches.md. A table the run does not have is said to be
missing, with its stage's exit status (docs/gpu/ holds one run: no earlier run's table stands in for it).

Legend: n tokens; *SDPA* PyTorch's fused exact attention (FlashAttention / memory-efficient kernels).
"""

from __future__ import annotations

import re
from pathlib import Path

from nystrom_lab.bench.models.cases import ALL_MODELS, MODELS
from nystrom_lab.bench.models.report import cases, compare_table
from nystrom_lab.bench.table1.report import num
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_csv, read_json
from nystrom_lab.docs.gpu_run import (
    GRAPHED_RUN,
    LAUNCHES,
    MODELS_RUN,
    STAGES,
    TABLE_STAGES,
    TABLES,
    speedups,
    stages,
)

DOC = "docs/benchmarks.md"
GPU_LABELS = {"ours-nystrom": "ours Nyström-64", "ours-softmax": "ours exact (SDPA)", "hf-bert": "HF BERT (SDPA)",
              "ours-nystrom-graphed": "ours Nyström-64, CUDA graph",
              "ours-nystrom-compiled": "ours Nyström-64, compile (reduce-overhead)"}  # fmt: skip
#: the outside modules, in the GPU tables where their CSV rows hold a time
GPU_EXTRA = {"hf-nystrom-64": "transformers Nyström-64", "lucidrains-64": "lucidrains Nyström-64",
             "transmil": "TransMIL layer, ours (m = 256)", "transmil-lucidrains": "TransMIL layer, lucidrains (m = 256)"}  # fmt: skip


def _by(rows: list[dict], method: str) -> dict[int, dict]:
    """One method's rows by n."""
    return {r["n"]: r for r in rows if r["method"] == method}


def _skipped(row: dict) -> str:
    """A case not run for its memory, as the size it would need: ``(128 GB)``."""
    need = re.search(r"~([\d.]+) GB", row.get("skipped", ""))
    return f"({float(need.group(1)):g} GB)" if need else "—"


def _cell(row: dict | None) -> str:
    """A time cell; ``—`` for a case without one (skipped, failed, not run)."""
    return num(row["ms"]) if row and "ms" in row else "—"


def _header(title: str, ns: list[int]) -> list[str]:
    """A table's first two lines: ``| title | n = 4096 | 16384 | ...``."""
    return ["| " + title + " | " + " | ".join(f"n = {n}" if i == 0 else str(n) for i, n in enumerate(ns)) + " |",
            "|---|" + "---:|" * len(ns)]  # fmt: skip


def _attention_table(title: str, rows: list[dict]) -> list[str]:
    """SDPA against Nyström (and the materialised softmax) per n, one precision and pass; the outside
    modules in ms / MB where they ran."""
    sdpa, nys, full = _by(rows, "sdpa"), _by(rows, "nystrom-64"), _by(rows, "transformer")
    ns, speed = sorted(sdpa), speedups(rows)
    mb = {n: f"{sdpa[n]['peak_mb']:.0f} / {nys[n]['peak_mb']:.0f}" if n in speed else "—" for n in ns}
    out = [*_header(title, ns),
           "| SDPA (exact, fused) ms | " + " | ".join(_cell(sdpa[n]) for n in ns) + " |",
           "| Nyström-64 ms | " + " | ".join(_cell(nys.get(n)) for n in ns) + " |",
           "| Nyström ÷ SDPA speed-up | " + " | ".join(
               "—" if n not in speed else f"**{speed[n]:.1f}×**" if speed[n] > 1 else f"{speed[n]:.2f}×" for n in ns) + " |",
           "| SDPA / Nyström peak MB | " + " | ".join(mb[n] for n in ns) + " |"]  # fmt: skip
    if full:
        out.append("| materialised softmax ms / MB | " + " | ".join(
            f"{num(full[n]['ms'])} / {full[n]['peak_mb']:.0f}" if "ms" in full.get(n, {}) else _skipped(full.get(n, {}))
            for n in ns) + " |")  # fmt: skip
    for method, label in GPU_EXTRA.items():
        got = _by(rows, method)
        if any("ms" in r for r in got.values()):
            out.append(f"| {label} ms / MB | " + " | ".join(
                f"{num(got[n]['ms'])} / {got[n]['peak_mb']:.0f}" if "ms" in got.get(n, {}) else "—" for n in ns) + " |")  # fmt: skip
    return out


def missing(name: str, log: Path) -> str:
    """Why the run has no table ``name`` (a key of :data:`TABLES`), from its stages.log."""
    rc, s = stages(log).get(TABLE_STAGES[name], (None, None))
    if rc is None:
        return "its stage did not run"
    return f"its stage ended with exit status {rc} after {s} s" + (
        " (past its time budget)" if rc == 124 else ""
    )


def gpu_attention(bf16_fwd: Path, bf16_fwdbwd: Path, fp32_fwd: Path, log: Path, fp16_fwd: Path) -> str:
    """Table 1's modules on the GPU: bf16 forward and forward + backward, the forward in fp16 and fp32."""
    out = [*_attention_table("bf16, forward", read_csv(bf16_fwd)), ""]
    out += [*_attention_table("bf16, forward + backward", read_csv(bf16_fwdbwd)), ""]
    others = {"fp16": read_csv(fp16_fwd) if fp16_fwd.is_file() else None, "fp32": read_csv(fp32_fwd)}
    ns = sorted(_by(others["fp32"], "sdpa"))
    out += _header("forward, other precisions", ns)
    for name, rows in others.items():
        if rows is None:
            continue
        sdpa, nys, hf = _by(rows, "sdpa"), _by(rows, "nystrom-64"), _by(rows, "hf-nystrom-64")
        out.append(f"| {name}: SDPA / Nyström ms | " + " | ".join(f"{_cell(sdpa.get(n))} / {_cell(nys.get(n))}" for n in ns) + " |")  # fmt: skip
        if any("ms" in r for r in hf.values()):
            out.append(f"| {name}: transformers Nyström-64 ms | " + " | ".join(_cell(hf.get(n)) for n in ns) + " |")  # fmt: skip
    if others["fp16"] is None:
        out += ["", f"No fp16 table in this run: {missing('float16_fwd', log)}."]
    return "\n".join(out)


def _models_table(run: dict, models: tuple[str, ...]) -> str:
    """One column per model that the run has, inference and training rows per n, in ms; then why each
    case without a time has none."""
    models = tuple(m for m in models if any(r["model"] == m for r in run["rows"]))
    lines = [([label, str(n)], cases(run, mode, n)) for mode, label in (("inference", "inference"), ("train", "train step"))
             for n in sorted({r["n"] for r in run["rows"] if r["mode"] == mode})]  # fmt: skip
    table = compare_table(["ms (peak MB)", "n"], lines, models=models, ms=True, labels=GPU_LABELS)
    why = sorted({f"{r['model']} {r['mode']} n={r['n']}: {r.get('skipped') or r.get('error')}" for r in run["rows"]
                  if "median_s" not in r})  # fmt: skip
    return table + ("\n\n¹ Not measured: " + "; ".join(why) + "." if why else "")


def gpu_models(path: Path) -> str:
    """Whole models on the GPU (the eager models), inference and a training step, in ms."""
    return _models_table(read_json(path), MODELS)


def gpu_models_graphed(path: Path) -> str:
    """Our Nyström model eager, replayed as a CUDA graph and compiled, against ours SDPA and transformers'
    Nystromformer, in ms."""
    run = read_json(path)
    if not run["rows"]:
        return "Not measured yet: `scripts/gpu_bench.sh` on a lent GPU writes its data."
    return _models_table(run, ALL_MODELS)


LAUNCH_CASES = {"module": "attention module, no mask", "module-mask": "attention module, mask of ones",
                "model-mask": "MiniLM-size model (6 layers), mask of ones"}  # fmt: skip


def launches_gpu(path: Path) -> str:
    """The real CUDA launches and host syncs per call (``torch.profiler``), ours against transformers'."""
    run = read_json(path)
    out = [f"{run['device']}, torch {run['torch']}, CUDA {run['cuda']}; n = {run['n']}, b = 1, float32, counted by "
           "`torch.profiler`.", "",
           "| case | pass | ours launches | HF launches | ours ÷ HF | host syncs ours / HF | forward ms ours / HF |",
           "|---|---|---:|---:|---:|---|---|"]  # fmt: skip
    for case, sides in run["cases"].items():
        ours, hf = sides["ours"], sides["hf"]
        for p, label in (("forward", "forward"), ("forward_backward", "fwd+bwd")):
            t = f"{ours['forward_ms']:.2f} / {hf['forward_ms']:.2f}" if p == "forward" else ""
            out.append(f"| {LAUNCH_CASES.get(case, case)} | {label} | {ours[p]['launches']} | {hf[p]['launches']} | "
                       f"{ours[p]['launches'] / hf[p]['launches']:.2f}× | {ours[p]['syncs']} / {hf[p]['syncs']} | {t} |")  # fmt: skip
    if "ours_model_graphed_forward_ms" in run:
        out += [
            "",
            f"Our model's forward replayed as a CUDA graph: {run['ours_model_graphed_forward_ms']:.2f} ms.",
        ]
    pairs = [
        (s["ours"][p], s["hf"][p]) for s in run["cases"].values() for p in ("forward", "forward_backward")
    ]
    ratios = [o["launches"] / h["launches"] for o, h in pairs]
    fewer = "fewer" if max(ratios) < 1 else "more" if min(ratios) > 1 else "fewer or more"
    out += [
        "",
        f"Ours launches {fewer} kernels than transformers' ({min(ratios):.2f}–{max(ratios):.2f}× theirs).",
    ]
    if all(o["syncs"] and h["syncs"] for o, h in pairs):
        out[-1] += (" The profiler counted at least one host sync per call in every case, ours and transformers', "
                    "their attention module without a mask included.")  # fmt: skip
    return "\n".join(out)


BLOCKS = [
    Block(DOC, "gpu-attention", (TABLES["bfloat16_fwd"], TABLES["bfloat16_fwdbwd"], TABLES["float32_fwd"], STAGES),
          gpu_attention, optional=(TABLES["float16_fwd"],)),
    Block(DOC, "gpu-models", (MODELS_RUN,), gpu_models),
    Block(DOC, "gpu-models-graphed", (GRAPHED_RUN,), gpu_models_graphed),
    Block("docs/gpu/launches.md", "launches-gpu", (LAUNCHES,), launches_gpu),
]  # fmt: skip
