"""The paper's Table 1: memory (MB) and time (ms) of one input through each self-attention module.

Legend: b batch, h heads, n tokens, d head dim, e = h·d model width.

Setting. The paper (Xiong et al. 2021, Table 1, a 1080Ti) gives no width for this table; its BERT
experiments use BERT-base self-attention, and its Transformer memory (10233 MB at n=8192, ≈ 3 fp32
(h, n, n) tensors for h=12) fits h=12 heads × d=64 (e=768), b=1. That is our default, fp32.

Methods (every one the same :class:`~nystrom.attention.base.AttentionBase` shell: one fused q/k/v
projection, the per-head core, one output projection; dropout 0, no conv skip):
``transformer`` is the paper's baseline written out here — scores QKᵀ·s materialised (b, h, n, n),
softmax, @V; ``sdpa`` is our fused exact ``softmax`` variant (PyTorch SDPA); the others come from
:data:`nystrom.attention.REGISTRY` at the paper's sizes. Each (method, n) case runs in a fresh process,
forked from one worker that imported torch once (:mod:`nystrom_lab.bench.forkserver`; ``fresh_process``:
a new interpreter per case, seconds slower a case: :func:`nystrom_lab.bench.harness.run_case`); the first
call measures the peak memory above the level before it (CPU: resident-set high-water mark; CUDA:
``max_memory_allocated``), i.e. the memory the module's call needs beyond its input and weights; then
the median of ``repeats`` timed calls. One case, its modules and its measurement:
:mod:`nystrom_lab.bench.table1.case`; here the driver, the skip rules and the report.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import time
from pathlib import Path

import torch

from nystrom_lab.bench.forkserver import CaseServer
from nystrom_lab.bench.harness import run_case
from nystrom_lab.bench.measure import machine_info, replace_section
from nystrom_lab.bench.table1 import outside_modules
from nystrom_lab.bench.table1.case import (  # noqa: F401 (re-exported: the tests and callers import them here)
    DTYPES,
    EXACT,
    METHODS,
    MaterializedSoftmaxAttention,
    build_case,
    build_module,
    check_device,
)
from nystrom_lab.bench.table1.report import DEFAULT_METHODS, PAPER_NOTE, plot, render, report, setting  # noqa: F401 (re-exported)

LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (512, 2048, 4096)
CASE_TIMEOUT_S = 1800
_TARGET = "nystrom_lab.bench.table1.case:measure"


def _available_mb(device: str) -> float:
    if device == "cuda":
        return torch.cuda.mem_get_info()[0] / 2**20
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("MemAvailable not found in /proc/meminfo")


def estimate_mb(method: str, *, n: int, batch: int, heads: int, itemsize: int, backward: bool) -> float:
    """Rough peak of the quadratic baseline (2 (b, h, n, n) tensors forward, 4 with backward); 0 for others."""
    if method != "transformer":
        return 0.0
    return (4 if backward else 2) * batch * heads * n * n * itemsize / 2**20


def _skip(
    method: str, n: int, too_slow: set[str], case: dict, *, max_n: int, max_exact_n: int, max_call_s: float
) -> str | None:
    """Why the (method, n) case is not run (see :func:`run`), or None."""
    limit = max_exact_n if method in EXACT else max_n
    if n > limit:
        return f"n > {'--max-exact-n' if method in EXACT else '--max-n'} {limit}"
    if method in too_slow:
        return f"a shorter n took over {max_call_s:g} s per call"
    name, opts = METHODS[method][1:]
    if outside_modules.missing(name):
        return outside_modules.missing(name)
    if name == "hf-nystromformer" and n % opts["num_landmarks"]:
        return f"transformers' Nyström needs n a multiple of m = {opts['num_landmarks']}"
    itemsize = torch.empty(0, dtype=getattr(torch, case["dtype"])).element_size()
    need = estimate_mb(
        method, n=n, batch=case["batch"], heads=case["heads"], itemsize=itemsize, backward=case["backward"]
    )
    if need > 0.7 * _available_mb(case["device"]):
        return f"needs ~{need / 1024:.1f} GB, over 70% of the free memory"
    return None


def _measure(server: CaseServer | None, case: dict, timeout_s: float = CASE_TIMEOUT_S) -> dict:
    """``{"ms", "peak_mb"}`` or ``{"error"}`` of one case: forked by ``server``, or in a new interpreter."""
    return run_case(_TARGET, case, timeout_s=timeout_s, server=server)


def run(
    *,
    lengths: list[int] | tuple[int, ...] = LENGTHS,
    methods: list[str] | tuple[str, ...] = DEFAULT_METHODS,
    batch: int = 1,
    heads: int = 12,
    dim_head: int = 64,
    dtype: str = "float32",
    device: str = "cpu",
    backward: bool = False,
    max_n: int = 16384,
    max_exact_n: int = 8192,
    repeats: int = 5,
    budget_s: float = 20.0,
    max_call_s: float = 60.0,
    threads: int = 0,
    out_dir: Path = Path("runs/bench"),
    markdown: Path | None = Path("runs/bench/benchmarks.md"),
    command: str = "nystrom bench",
    fresh_process: bool = False,
    deadline_s: float | None = None,
) -> list[dict]:
    """Run every (method, n) case in a fresh process; write CSV, markdown and PNG; return the rows.

    The processes are forked from one worker (torch imported once); ``fresh_process`` starts a new
    interpreter per case instead (as before the worker, ≈ 8 s more a case on the 2-core VM). A case is
    skipped (and says why) when n is above ``max_n`` (``max_exact_n`` for the exact methods), when the
    quadratic baseline would need more than 70% of the free memory, or when the same method's call at a
    shorter n already took over ``max_call_s``; one running past ``CASE_TIMEOUT_S`` is killed. With
    ``deadline_s`` (seconds from the start; a time-boxed run such as scripts/gpu_bench.sh) a case is
    killed at the deadline and the cases after it are skipped ("over the run's time budget"), so the
    outputs are always written.
    """
    from tqdm import tqdm

    check_device(device)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"methods: unknown {bad}; choose from {list(METHODS)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    case = {"batch": batch, "heads": heads, "dim_head": dim_head, "dtype": dtype, "device": device}
    case |= {"backward": backward, "repeats": repeats, "budget": budget_s, "threads": threads}
    fresh_process = fresh_process or not hasattr(os, "fork")  # the worker forks its cases (POSIX)
    # the worker's cases get the thread count a fresh process would have (it runs with one: forkserver.py)
    server = None if fresh_process else CaseServer(_TARGET, threads=threads or torch.get_num_threads())
    cases = [(m, n) for n in sorted(lengths) for m in methods]
    rows: list[dict] = []
    too_slow: set[str] = set()
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    with server or contextlib.nullcontext():
        for method, n in tqdm(cases, desc="table1", unit="case"):
            rows.append(row := {"method": method, "label": METHODS[method][0], "n": n})
            skip = _skip(
                method, n, too_slow, case, max_n=max_n, max_exact_n=max_exact_n, max_call_s=max_call_s
            )
            left = CASE_TIMEOUT_S if deadline_s is None else deadline_s - (time.perf_counter() - start)
            if left < 1:
                skip = skip or f"over the run's time budget ({deadline_s:g} s)"
            if skip:
                row["skipped"] = skip
                continue
            timeout_s = min(CASE_TIMEOUT_S, left)
            try:
                row.update(_measure(server, {**case, "method": method, "n": n}, timeout_s))
            except subprocess.TimeoutExpired:
                row["error"] = f"timed out after {timeout_s:.0f} s"
            if row.get("ms", 0.0) > 1e3 * max_call_s:
                too_slow.add(method)
    mode = "fwdbwd" if backward else "fwd"
    info = machine_info()
    info["threads"] = str(threads or info["threads"])
    # the run record: with the CSV's rows, all that `nystrom docs render` needs to rebuild the report
    record = {
        "command": command, "batch": batch, "heads": heads, "dim_head": dim_head, "dtype": dtype,
        "device": device, "backward": backward, "repeats": repeats, "fresh_process": fresh_process,
        "seconds": time.perf_counter() - start, "load_start": load_start, "load_end": os.getloadavg()[0],
        "info": info,
    }  # fmt: skip
    body = report(rows, record)
    print(body)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"table1_{mode}.csv", "w", newline="") as f:
        fields = ["method", "label", "n", "ms", "peak_mb", "skipped", "error"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})
    (out_dir / f"table1_{mode}.json").write_text(json.dumps(record, indent=1) + "\n")
    (out_dir / f"table1_{mode}.md").write_text(body + "\n")
    plot(rows, record, out_dir / f"table1_{mode}.png")
    if markdown is not None:
        replace_section(markdown, "table1" if not backward else "table1-fwdbwd", body)
    return rows
