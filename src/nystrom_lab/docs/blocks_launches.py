"""Blocks of docs/gpu/launches.md: ops dispatched per forward and forward + backward on the
meta device, ours vs transformers' Nyströmformer, before and after the launch work.

Data: ``docs/gpu/launches_before.json`` (``nystrom bench launches --out …`` on the code before the work)
and ``docs/gpu/launches.json`` (the same command on the code now).
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.bench.launches.report import before_after, render
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_json

DOC = "docs/gpu/launches.md"
BEFORE = "docs/gpu/launches_before.json"
AFTER = "docs/gpu/launches.json"


def report(path: Path) -> str:
    """A run's own report (what ``nystrom bench launches`` prints and writes)."""
    return render(read_json(path)).rstrip("\n")


def compare(before: Path, after: Path) -> str:
    """Our ops before and after, and after ÷ HF."""
    return before_after(read_json(before), read_json(after))


AB = ("docs/cpu/launches_ab/cpu_ab.json", "docs/cpu/launches_ab/cpu_ab_2.json")


def cpu_ab(*paths: Path) -> str:
    """The CPU A/B of the code before and after the launch work (``scripts/compare_checkouts_cpu.py``), every run, with
    transformers' Nystromformer measured in the same process."""
    runs = [read_json(p) for p in paths]
    m = runs[0]["machine"]
    out = [f"{m.get('cpu', '?')}, {m.get('threads', '?')} threads; MiniLM-size model at 4096 tokens (fp32, batch 1,"
           " mask of ones), best of 3; attention module at 16384 tokens (h = 8, d = 64, m = 64).", "",
           "| file | round | code | inference s | HF s | HF ÷ ours | training step s | HF s | HF ÷ ours | module 16K s |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for path, run in zip(paths, runs):
        for r in run["rows"]:
            out.append(f"| {Path(path).name} | {r['round']} | {r['code']} | {r['ours_infer_s']:.3f} | {r['hf_infer_s']:.3f} |"
                       f" {r['hf_infer_s'] / r['ours_infer_s']:.2f}× | {r['ours_train_s']:.3f} | {r['hf_train_s']:.3f} |"
                       f" {r['hf_train_s'] / r['ours_train_s']:.2f}× | {r['module_16k_s']:.3f} |")  # fmt: skip
    means = {}
    for run in runs:
        for r in run["rows"]:
            for k in ("ours_infer_s", "ours_train_s", "module_16k_s"):
                means.setdefault((r["code"], k), []).append(r[k])
    avg = {key: sum(v) / len(v) for key, v in means.items()}
    out += ["", "Means: " + "; ".join(
        f"{label} {avg[('before', k)]:.3f} → {avg[('after', k)]:.3f} s"
        for label, k in (("inference", "ours_infer_s"), ("training step", "ours_train_s"), ("module", "module_16k_s"))
    )]  # fmt: skip
    return "\n".join(out)


BLOCKS = [
    Block(DOC, "cpu-ab", AB, cpu_ab),
    Block(DOC, "launches-before-after", (BEFORE, AFTER), compare),
    Block(DOC, "launches-after", (AFTER,), report),
    Block(DOC, "launches-before", (BEFORE,), report),
]
