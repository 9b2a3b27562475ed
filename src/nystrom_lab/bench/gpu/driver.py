"""The stages of the project's time-boxed GPU benchmark (``scripts/gpu_bench.sh``), each one command:

``python -m nystrom_lab.bench.gpu.driver STAGE OUT [--dry] [--quick] [--budget S] [args]``, STAGE one of

- ``env``: ``OUT/env.txt`` (nvidia-smi's GPU name, memory, driver; python, torch, CUDA, transformers,
  the GPU; whether lucidrains' package imports; the commit);
- ``tests``: ``pytest -m gpu`` of the launch work and the GPU suite -> ``OUT/gpu_tests.txt``;
- ``fused``: the fused Triton kernels measured where they run (:mod:`nystrom_lab.bench.gpu.fused_stage`):
  memory of the first call, per-kernel profiler times beside SDPA, the module eager against its CUDA
  graph, a sweep of warps, stages and token blocks -> ``OUT/fused_tuning.json``, a call past 2³¹ elements,
  two GPUs -> ``OUT/fused_*.json`` and ``OUT/fused_summary.md``;
- ``packing``: a packed row against one document of the same n, through the fused kernels and the PyTorch
  path (:mod:`nystrom_lab.bench.packing.cost_gpu`) -> ``OUT/packing_gpu.json`` (+ ``.md``);
- ``launches``: real CUDA launches per forward -> ``OUT/launches_gpu.json``
  (:mod:`nystrom_lab.bench.launches.gpu` without its tests);
- ``table DTYPE fwd|fwdbwd``: Table 1's modules at 4K–128K -> ``OUT/table1_{DTYPE}_{fwd|fwdbwd}.csv``
  (+ ``.json``, the run's setting); bf16: :data:`TABLE_METHODS` (SDPA, ours, the materialised softmax,
  transformers' and lucidrains' Nyström, the TransMIL layer), fp16/fp32: :data:`LEAN_METHODS` (SDPA, ours,
  transformers' Nyström: what docs/benchmarks.md shows for them);
- ``models``: whole MiniLM-size models at 4096 and 16384, inference and a training step, bf16 autocast:
  eager (ours Nyström, ours SDPA, transformers' Nystromformer and BERT) and ours through ``GraphedForward``,
  then ``torch.compile(mode="reduce-overhead")`` inference at the longest length only (its compile takes
  ≈ 31 s a case on an H100) -> ``OUT/bench_models_gpu.json`` (the eager models) and
  ``OUT/bench_models_gpu_graphed.json`` (ours eager, CUDA graph, compiled, against ours SDPA and
  transformers' Nystromformer).

``--budget`` is the stage's whole wall time in seconds, counted from this process's start (imports
included, as ``stages.log`` measures it): each stage sets its cases' deadline so that it ends within it
(cases past it are reported "over the run's time budget", the files are still written); the script's
``timeout`` (10 s more) is the backstop. ``--dry``: the same entry points on the CPU at tiny sizes
(n ≤ 256, one call), for the tests; ``OUT/DRY`` marks its outputs, which :func:`commit` refuses.
``--quick``: 4096 and 16384 only. ``commit OUT [--force]`` replaces docs/gpu/'s run with the one in OUT
and re-renders the docs (``scripts/gpu_bench_commit.sh``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.monotonic()  # this process's start, near enough: a stage's --budget counts from here

from nystrom_lab.bench.gpu.fused_stage import FILES as FUSED_FILES  # noqa: E402

#: Table 1's methods on the GPU: the bf16 tables run all (ours fused, the default, and on the PyTorch path);
#: the fp16/fp32 forward only the rendered three
TABLE_METHODS = ("sdpa", "nystrom-64", "nystrom-64-pytorch", "transformer", "hf-nystrom-64", "lucidrains-64",
                 "transmil", "transmil-lucidrains")  # fmt: skip
LEAN_METHODS = ("sdpa", "nystrom-64", "hf-nystrom-64")
#: the whole-model runs: eager (+ ours through GraphedForward), then torch.compile (its compile is slow)
EAGER = ("ours-nystrom", "ours-softmax", "hf-nystromformer", "hf-bert", "ours-nystrom-pytorch", "hf-bert-nystrom")
GRAPHED_TABLE = (
    "ours-nystrom",
    "ours-nystrom-graphed",
    "ours-nystrom-compiled",
    "ours-softmax",
    "hf-nystromformer",
)
#: the files a run writes, as they are named in docs/gpu/
FILES = ("env.txt", "stages.log", "gpu_tests.txt", "launches_gpu.json", "bench_models_gpu.json",
         "packing_gpu.json", "packing_gpu.md",
         "bench_models_gpu_graphed.json", *FUSED_FILES,
         *(f"table1_{t}.{ext}" for t in ("bfloat16_fwd", "bfloat16_fwdbwd", "float16_fwd", "float32_fwd")
           for ext in ("csv", "json")))  # fmt: skip
#: the run's provenance, kept by whoever ran it: a note (machine, date, commit, command, what failed) and
#: the script's whole output
PROVENANCE = ("README.md", "run.log")
#: seconds a stage keeps after its cases for the report, files, plot and exit
TABLE_TAIL_S, MODELS_TAIL_S = 8.0, 6.0
#: seconds of the models stage held back for the compiled case (worker start, a ≈ 31 s compile, the calls),
#: run only when the stage has at least COMPILED_FROM_S (the eager and graphed cases, ~70 s, come first)
COMPILED_S, COMPILED_FROM_S = 50.0, 130.0
ROOT = Path(__file__).resolve().parents[4]


def left(budget: float, tail: float = 0.0) -> float:
    """Seconds this stage may still spend on its cases: its budget less what it has run and its ``tail``."""
    return budget - (time.monotonic() - T0) - tail


def env(out: Path, *, dry: bool) -> str:
    """``env.txt``: nvidia-smi's line (the GPU name first: docs read it), then the software."""
    import torch

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:
        smi = f"no nvidia-smi ({type(err).__name__})"
    try:
        import transformers

        hf = transformers.__version__
    except ImportError:
        hf = "not installed"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    lucid = "importable" if importlib.util.find_spec("nystrom_attention") else "not importable"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    text = (f"{smi}\npython {platform.python_version()} torch {torch.__version__} cuda {torch.version.cuda} "
            f"transformers {hf} {gpu}\nnystrom_attention (lucidrains) {lucid}; commit {commit or 'unknown'}"
            + ("; DRY RUN on the CPU" if dry else "") + "\n")  # fmt: skip
    (out / "env.txt").write_text(text, encoding="utf-8")
    if dry:
        (out / "DRY").write_text("a dry run's outputs: not for docs/gpu/\n")
    return text


def tests(out: Path, *, dry: bool, budget: float) -> int:
    """``pytest -m gpu`` of the launch work and the GPU suite (dry: only collected)."""
    from nystrom_lab.bench.launches.gpu import GPU_TESTS

    if dry:
        args = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--co",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            *GPU_TESTS,
        ]
        done = subprocess.run(args, capture_output=True, text=True, timeout=max(left(budget, 2), 5), cwd=ROOT)
        print(done.stdout[-2000:])
        return done.returncode
    from nystrom_lab.bench.launches.gpu import run_gpu_tests

    return run_gpu_tests(out, timeout_s=max(left(budget, 2), 5)).returncode


def launches(out: Path, *, dry: bool) -> int:
    """Real CUDA launches of the launch-count cases (refused without CUDA: a dry run says so)."""
    if dry:
        print("dry run: launches_gpu needs CUDA, not run")
        return 0
    from nystrom_lab.bench.launches import gpu as launches_gpu

    return launches_gpu.main([str(out), "--no-tests"])


def table(out: Path, dtype: str, mode: str, *, dry: bool, quick: bool, budget: float) -> list[dict]:
    """One Table 1 run (h = 8, d = 64, b = 1) -> ``table1_{dtype}_{mode}.csv``, ending within ``budget``."""
    from nystrom_lab.bench.table1.driver import run

    methods = TABLE_METHODS if dtype == "bfloat16" else LEAN_METHODS
    lengths = (4096, 16384) if quick else (4096, 16384, 65536, 131072)
    if dtype == "bfloat16" and not quick:
        lengths = (1024, *lengths)  # where users train on GPUs: 1K-16K
    gpu = dict(device="cuda", heads=8, dim_head=64, repeats=10, budget_s=1.5)
    if dry:
        gpu = dict(device="cpu", heads=2, dim_head=16, repeats=1, budget_s=0.1, threads=1)
        lengths = (128, 256)
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(lengths=lengths, methods=methods, dtype=dtype, backward=mode == "fwdbwd", max_n=max(lengths),
                   max_exact_n=max(lengths), out_dir=Path(tmp), markdown=None, deadline_s=left(budget, TABLE_TAIL_S),
                   command=f"python -m nystrom_lab.bench.gpu.driver table {dtype} {mode}", **gpu)  # fmt: skip
        for ext in ("csv", "json"):
            shutil.copy(Path(tmp) / f"table1_{mode}.{ext}", out / f"table1_{dtype}_{mode}.{ext}")
    return rows


def _strip(rows: list[dict]) -> list[dict]:
    """Rows without the ratios :func:`~nystrom_lab.bench.models.driver.add_ratios` added (they are recomputed)."""
    return [{k: v for k, v in r.items() if k not in ("vs_fastest_other", "vs_ours_exact", "floor_s", "x_floor")}
            for r in rows]  # fmt: skip


def _write_models(report: dict, rows: list[dict], models: tuple[str, ...], path: Path) -> dict:
    """``report`` with ``rows`` of ``models`` (ratios recomputed) to ``path`` (.json and .md)."""
    from nystrom_lab.bench.models.cases import SIZES
    from nystrom_lab.bench.models.driver import add_ratios
    from nystrom_lab.bench.models.report import render

    rows = _strip([r for r in rows if r["model"] in models])
    rates = {int(n): rate for n, rate in report["gemm_gflops"].items()}
    add_ratios(rows, SIZES[report["size"]], rates)
    report = {**report, "rows": rows}
    path.write_text(json.dumps(report, indent=2) + "\n")
    path.with_suffix(".md").write_text(render(report))
    return report


def models(out: Path, *, dry: bool, quick: bool, budget: float) -> dict:
    """The eager + GraphedForward run, then the compiled inference at the longest length in the
    :data:`COMPILED_S` held back for it (and whatever the eager run left), all within ``budget``; with a
    budget under :data:`COMPILED_FROM_S` the eager run gets it all and the compiled case is not run."""
    from nystrom_lab.bench.models.driver import run

    start = time.perf_counter()
    lengths = (4096,) if quick else (4096, 16384)
    opts = dict(size="minilm", rounds=1, repeats=3, dtype="bf16", device="cuda", timeout_s=120, progress=False,
                fork=True)  # fmt: skip
    if dry:
        lengths = (64,)
        opts |= dict(size="tiny", repeats=1, dtype="fp32", device="cpu", threads=1)
    compiled_s = COMPILED_S if budget >= COMPILED_FROM_S else 0.0
    with tempfile.TemporaryDirectory() as tmp:
        eager = run(models=(*EAGER, "ours-nystrom-graphed"), modes=("inference", "train"), lengths=lengths,
                    out_dir=Path(tmp), name="eager", deadline_s=left(budget, MODELS_TAIL_S + compiled_s),
                    **opts)  # fmt: skip
        compiled = {"rows": []}
        if compiled_s:
            compiled = run(models=("ours-nystrom-compiled",), modes=("inference",), lengths=lengths[-1:],
                           out_dir=Path(tmp), name="compiled",
                           deadline_s=max(left(budget, MODELS_TAIL_S), 1.0), **opts)  # fmt: skip
        else:
            print(f"models: the compiled case is not run (the stage has {budget:.0f} s,"
                  f" < {COMPILED_FROM_S:.0f} s)")
    rows = eager["rows"] + compiled["rows"]
    eager["wall_s"] = time.perf_counter() - start
    _write_models(eager, rows, EAGER, out / "bench_models_gpu.json")
    return _write_models(eager, rows, GRAPHED_TABLE, out / "bench_models_gpu_graphed.json")


def fused(out: Path, *, dry: bool, budget: float) -> dict:
    """The fused kernels' stage (:mod:`nystrom_lab.bench.gpu.fused_stage`), ending within ``budget``."""
    from nystrom_lab.bench.gpu.fused_stage import run

    return run(out, dry=dry, until=T0 + budget)


def packing(out: Path, *, dry: bool, budget: float) -> dict:
    """Packed rows against one document (:mod:`nystrom_lab.bench.packing.cost_gpu`), within ``budget``."""
    import os

    if dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    from nystrom_lab.bench.packing import cost_gpu

    record = cost_gpu.run(dry=dry, until=T0 + budget - 3)
    (out / "packing_gpu.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "packing_gpu.md").write_text(cost_gpu.table(record))
    return record


def commit(out: Path, *, force: bool = False, root: Path = ROOT, render: bool = True) -> list[str]:
    """This run's :data:`FILES` and :data:`PROVENANCE` into ``root``/docs/gpu/ (:func:`.commit.commit`)."""
    from nystrom_lab.bench.gpu.commit import commit as into_docs

    return into_docs(out, files=FILES, provenance=PROVENANCE, root=root, force=force, render=render)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nystrom_lab.bench.gpu.driver")
    p.add_argument("stage", choices=("env", "tests", "fused", "packing", "launches", "table", "models", "commit"))
    p.add_argument("out", type=Path)
    p.add_argument("args", nargs="*", help="table: DTYPE fwd|fwdbwd")
    p.add_argument("--dry", action="store_true", help="on the CPU at tiny sizes (tests; outputs marked DRY)")
    p.add_argument("--quick", action="store_true", help="4096 and 16384 only")
    p.add_argument("--budget", type=float, default=120.0, help="the stage's seconds")
    p.add_argument("--force", action="store_true", help="commit: copy tables cut by the time budget too")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.stage == "env":
        print(env(a.out, dry=a.dry))
    elif a.stage == "tests":
        return tests(a.out, dry=a.dry, budget=a.budget)
    elif a.stage == "fused":
        fused(a.out, dry=a.dry, budget=a.budget)
    elif a.stage == "packing":
        packing(a.out, dry=a.dry, budget=a.budget)
        print((a.out / "packing_gpu.md").read_text())
    elif a.stage == "launches":
        return launches(a.out, dry=a.dry)
    elif a.stage == "table":
        dtype, mode = a.args
        table(a.out, dtype, mode, dry=a.dry, quick=a.quick, budget=a.budget)
    elif a.stage == "models":
        print(
            (a.out / "bench_models_gpu_graphed.md").read_text()
            if models(a.out, dry=a.dry, quick=a.quick, budget=a.budget)
            else ""
        )
    else:
        commit(a.out, force=a.force)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
