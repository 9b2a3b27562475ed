"""The paper's Table 1: memory (MB) and time (ms) of one input through each self-attention module.

Legend: b batch, h heads, n tokens, d head dim, e = h·d model width.

Setting. The paper (Xiong et al. 2021, Table 1, a 1080Ti) gives no width for this table; its BERT
experiments use BERT-base self-attention, and its Transformer memory (10233 MB at n=8192, ≈ 3 fp32
(h, n, n) tensors for h=12) fits h=12 heads × d=64 (e=768), b=1. That is our default, fp32.

Methods (every one the same :class:`~nystrom.attention.base.AttentionBase` shell: one fused q/k/v
projection, the per-head core, one output projection; dropout 0, no conv skip):
``transformer`` is the paper's baseline written out here — scores QKᵀ·s materialised (b, h, n, n),
softmax, @V; ``sdpa`` is our fused exact ``softmax`` variant (PyTorch SDPA); the others come from
:data:`nystrom.attention.REGISTRY` at the paper's sizes. Each (method, n) case runs in a fresh process
(:func:`nystrom.bench.common.run_child`); the first call measures the peak memory above the level before
it (CPU: resident-set high-water mark; CUDA: ``max_memory_allocated``), i.e. the memory the module's
call needs beyond its input and weights; then the median of ``repeats`` timed calls.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from nystrom.attention import REGISTRY, AttentionBase
from nystrom.bench.common import machine_info, median_time_ms, peak_memory_mb, replace_section, run_child

#: key -> (label as in the paper, registry name or "transformer", constructor options)
METHODS: dict[str, tuple[str, str, dict]] = {
    "transformer": ("Transformer", "transformer", {}),
    "sdpa": ("SDPA (fused exact)", "softmax", {}),
    "linformer-256": ("Linformer-256", "linformer", {"proj_len": 256}),
    "longformer-257": ("Longformer-257", "longformer", {"window_size": 257}),
    "nystrom-64": ("Nyströmformer-64", "nystrom", {"num_landmarks": 64, "conv_kernel_size": None}),
    "nystrom-32": ("Nyströmformer-32", "nystrom", {"num_landmarks": 32, "conv_kernel_size": None}),
    "performer-256": ("Performer-256", "performer", {"num_features": 256}),
    "reformer-2": ("Reformer-2", "reformer", {"n_hashes": 2, "bucket_size": 64}),
}
EXACT = ("transformer", "sdpa")
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (512, 2048, 4096)
DTYPES = ("float32", "bfloat16", "float16", "float64")
PAPER_NOTE = (
    "Paper (1080Ti GPU, forward): Nyströmformer-64 vs Transformer 11.5× memory / 5.6× time at n=4096 and "
    "22.8× / 12.7× at n=8192; vs Longformer-257 at n=8192 1.2× memory, 3× time."
)


class MaterializedSoftmaxAttention(AttentionBase):
    """The paper's Transformer baseline: ``softmax(Q Kᵀ s) V`` with the (b, h, n, n) scores in memory."""

    name = "transformer"

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d)."""
        scores = q @ k.mT / math.sqrt(q.shape[-1])  # (b, h, n, n): two such tensors live for a moment
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        return torch.softmax(scores, -1) @ v  # (b, h, n, d)


def build_module(method: str, *, n: int, heads: int, dim_head: int) -> AttentionBase:
    """The attention module of ``method`` (a key of :data:`METHODS`) for inputs of n tokens."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    _, name, opts = METHODS[method]
    e = heads * dim_head
    if name == "transformer":
        return MaterializedSoftmaxAttention(e, heads=heads, dim_head=dim_head)
    if name == "linformer":
        opts = {**opts, "max_seq_len": n}  # its (p, N) projections are sized for the longest input
    return REGISTRY[name](e, heads=heads, dim_head=dim_head, **opts)


def build_case(
    method: str,
    *,
    n: int,
    batch: int,
    heads: int,
    dim_head: int,
    dtype: torch.dtype,
    device: str,
    backward: bool,
):
    """A zero-argument callable running one input (b, n, e) through the module (+ backward of ``out.sum()``)."""
    mod = build_module(method, n=n, heads=heads, dim_head=dim_head).to(device=device, dtype=dtype).eval()
    x = torch.randn(batch, n, heads * dim_head, dtype=dtype, device=device)  # (b, n, e)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if not backward:

        def fwd():
            with torch.no_grad():
                out = mod(x)  # (b, n, e)
            sync()
            return out

        return fwd
    xg = x.clone().requires_grad_()

    def fwdbwd():
        mod(xg).sum().backward()
        sync()
        mod.zero_grad(set_to_none=True)
        xg.grad = None

    return fwdbwd


def _cuda_peak_mb(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    peak = torch.cuda.max_memory_allocated()
    del out
    return (peak - before) / 2**20


def child_main(argv: list[str]) -> dict:
    """Entry point of one fresh-process case; prints and returns ``{"ms", "peak_mb"}``."""
    p = argparse.ArgumentParser(prog="python -m nystrom.bench.table1")
    p.add_argument("method", choices=list(METHODS))
    p.add_argument("n", type=int)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim-head", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--backward", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--budget", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    a = p.parse_args(argv)
    check_device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    fn = build_case(
        a.method,
        n=a.n,
        batch=a.batch,
        heads=a.heads,
        dim_head=a.dim_head,
        dtype=getattr(torch, a.dtype),
        device=a.device,
        backward=a.backward,
    )
    mem = _cuda_peak_mb(fn) if a.device == "cuda" else peak_memory_mb(fn)  # doubles as the warm-up
    ms = median_time_ms(fn, repeats=a.repeats, budget_s=a.budget, warmup=0)
    res = {"ms": ms, "peak_mb": mem}
    print(json.dumps(res))
    return res


def check_device(device: str) -> None:
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, cuda build "
            f"{torch.version.cuda or 'none'}); use --device cpu"
        )


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


def run(
    *,
    lengths: list[int] | tuple[int, ...] = LENGTHS,
    methods: list[str] | tuple[str, ...] = tuple(METHODS),
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
    out_dir: Path = Path("docs"),
    markdown: Path | None = Path("docs/benchmarks.md"),
    command: str = "nystrom bench",
) -> list[dict]:
    """Run every (method, n) case in a fresh process; write CSV, markdown and PNG; return the rows.

    A case is skipped (and says why) when n is above ``max_n`` (``max_exact_n`` for the exact methods),
    when the quadratic baseline would need more than 70% of the free memory, or when the same method's
    call at a shorter n already took over ``max_call_s``.
    """
    from tqdm import tqdm

    check_device(device)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"methods: unknown {bad}; choose from {list(METHODS)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    itemsize = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    common = ["--batch", str(batch), "--heads", str(heads), "--dim-head", str(dim_head), "--dtype", dtype]
    common += ["--device", device, "--repeats", str(repeats), "--budget", str(budget_s)]
    common += ["--threads", str(threads), *(["--backward"] if backward else [])]
    cases = [(m, n) for n in sorted(lengths) for m in methods]
    rows: list[dict] = []
    too_slow: set[str] = set()
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    for method, n in tqdm(cases, desc="table1", unit="case"):
        row = {"method": method, "label": METHODS[method][0], "n": n}
        limit = max_exact_n if method in EXACT else max_n
        need = estimate_mb(method, n=n, batch=batch, heads=heads, itemsize=itemsize, backward=backward)
        if n > limit:
            row["skipped"] = f"n > {'--max-exact-n' if method in EXACT else '--max-n'} {limit}"
        elif method in too_slow:
            row["skipped"] = f"a shorter n took over {max_call_s:g} s per call"
        elif need > 0.7 * _available_mb(device):
            row["skipped"] = f"needs ~{need / 1024:.1f} GB, over 70% of the free memory"
        else:
            try:
                row.update(run_child("nystrom.bench.table1", [method, str(n), *common], timeout_s=1800))
            except subprocess.TimeoutExpired:
                row["error"] = "timed out after 1800 s"
            if row.get("ms", 0.0) > 1e3 * max_call_s:
                too_slow.add(method)
        rows.append(row)
    mode = "fwdbwd" if backward else "fwd"
    info = machine_info()
    setting = (
        f"b={batch}, h={heads}, d={dim_head} (e={heads * dim_head}), {dtype}, {device}, "
        f"{'forward + backward of out.sum()' if backward else 'forward under no_grad'}, conv skip off, "
        f"{repeats} timed calls (median), each case in a fresh process; "
        f"{time.perf_counter() - start:.0f} s in all; 1-min load average {load_start:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end (timings are only meaningful on an otherwise idle machine)."
    )
    table = render(rows)
    body = "\n".join(
        [
            f"Command: `{command}`",
            "",
            f"Setting: {setting}",
            f"Machine: {info['cpu']}, {threads or info['threads']} threads, {info['platform']}; torch {info['torch']}, "
            f"Python {info['python']}.",
            "Cells: memory MB (Transformer / method) and time ms (Transformer / method); "
            "memory = peak above the level before the call (input and weights excluded).",
            PAPER_NOTE,
            "",
            table,
            "",
            f"![time and memory vs n](table1_{mode}.png) — data: `table1_{mode}.csv`.",
        ]
    )
    print(body)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"table1_{mode}.csv", "w", newline="") as f:
        fields = ["method", "label", "n", "ms", "peak_mb", "skipped", "error"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})
    (out_dir / f"table1_{mode}.md").write_text(body + "\n")
    from nystrom.bench.plots import plot_table1

    plot_table1(rows, out_dir / f"table1_{mode}.png", title=setting.split(", each case")[0])
    if markdown is not None:
        replace_section(markdown, "table1" if not backward else "table1-fwdbwd", body)
    return rows


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _ratio(ref: float | None, val: float) -> str:
    if ref is None or val <= 0:
        return ""
    r = ref / val
    return f" ({r:.1f}×)" if r >= 0.95 else f" ({r:.2f}×)"


def render(rows: list[dict]) -> str:
    """The paper's layout: one row per method, per n a memory (MB) and a time (ms) cell, each with its
    ratio to the Transformer at that n, e.g. ``450 (22.8×)``; ``skip``/``error`` cells are footnoted."""
    lengths = sorted({r["n"] for r in rows})
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    get = {(r["method"], r["n"]): r for r in rows}
    head = ["self-attention"] + [f"{n} {unit}" for n in lengths for unit in ("MB", "ms")]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    notes: list[str] = []
    for m in methods:
        cells = [METHODS[m][0]]
        for n in lengths:
            r, ref = get.get((m, n), {}), get.get(("transformer", n), {})
            if "ms" not in r:
                why = r.get("skipped") or r.get("error") or "not run"
                notes.append(f"{METHODS[m][0]} at n={n}: {why}")
                cells += ["skip" if "skipped" in r else "error"] * 2
                continue
            cells.append(_num(r["peak_mb"]) + _ratio(ref.get("peak_mb"), r["peak_mb"]))
            cells.append(_num(r["ms"]) + _ratio(ref.get("ms"), r["ms"]))
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", *(f"- {t}" for t in notes)]
    return "\n".join(lines)


if __name__ == "__main__":
    child_main(sys.argv[1:])
