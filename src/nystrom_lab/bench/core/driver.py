"""Attention-core and module benchmark: nystrom vs HuggingFace, lucidrains and exact SDPA.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, e = h·d model width.

Cases (each in a fresh process): ``core`` = attention from given q, k, v (no projections) forward;
``fwd`` = the whole module forward under ``no_grad``; ``fwdbwd`` = module forward + backward of
``out.sum()``. All implementations get the same weights (conv skip off), b=1, fp32 by default.
The FLOP floor of the Nyström core is 8·n·m·d·h FLOPs over the large-GEMM rate, timed alternately
with our core in the same process (the VM's speed drifts within a run).
"""

from __future__ import annotations

import csv
import inspect
import json
from pathlib import Path

import torch
from torch import nn

from nystrom.attention import NystromAttention, SoftmaxAttention
from nystrom.functional import nystrom_attention, softmax_attention
from nystrom_lab.bench.comparisons import HFSelfAttention, hf_nystrom_self_attention, lucidrains_layer
from nystrom_lab.bench.core.report import IMPLS, MODES, render
from nystrom_lab.bench.harness import run_case
from nystrom_lab.bench.measure import (
    gemm_gflops,
    machine_info,
    median_time_and_gemm_rate,
    median_time_ms,
    peak_memory_mb,
    replace_section,
)

#: our module's defaults: the other implementations are configured alike, and an unset m is ours
OURS = {k: p.default for k, p in inspect.signature(NystromAttention).parameters.items()}
# Calls before timing, every implementation alike. Why more than one: on this VM the first touches of
# fresh large buffers in a new process are slow (a 134 MB buffer: 150-190 ms for its first two fills,
# 12 ms from the third; host-side backing of guest memory), so a 65536-token case settles only
# from its 4th call (measured per call: 320, 320, 270, 185, 175, 170, ... ms).
WARMUP_CALLS = 4
_TARGET = "nystrom_lab.bench.core.driver:measure"


def _hf_core(e: int, h: int, m: int, n: int) -> nn.Module:
    """transformers' module with identity q/k/v projections: q = k = v = the input, the core alone."""
    attn = hf_nystrom_self_attention(e, heads=h, landmarks=m, n=n)
    attn.query = attn.key = attn.value = nn.Identity()
    return attn


def _lucidrains_core(e: int, h: int, d: int, m: int) -> nn.Module:
    """lucidrains' module without projections: the caller feeds the (b, n, 3e) q|k|v tensor directly."""
    mod = lucidrains_layer(e, heads=h, dim_head=d, landmarks=m)
    mod.to_qkv = nn.Identity()
    mod.to_out = nn.Identity()
    return mod


def build_case(impl: str, mode: str, *, n: int, h: int, d: int, m: int, dtype: torch.dtype):
    """Return a zero-argument callable that runs one case."""
    e = h * d
    x = torch.randn(1, n, e, dtype=dtype)
    if mode == "core":
        if impl == "nystrom":
            q = x.view(1, n, h, d).transpose(1, 2)  # (b, h, n, d)
            return lambda: nystrom_attention(q, q, q, num_landmarks=m)
        if impl == "sdpa":
            q = x.view(1, n, h, d).transpose(1, 2)
            return lambda: softmax_attention(q, q, q)
        if impl == "hf":
            mod = _hf_core(e, h, m, n).to(dtype)
            return lambda: mod(x)  # identity q/k/v projections: q = k = v = x
        mod = _lucidrains_core(e, h, d, m).to(dtype)
        x3 = torch.cat([x, x, x], -1)  # (b, n, 3e), built outside the timed call
        return lambda: mod(x3)
    if impl == "nystrom":
        mod = NystromAttention(e, heads=h, dim_head=d, num_landmarks=m, conv_kernel_size=None)
    elif impl == "sdpa":
        mod = SoftmaxAttention(e, heads=h, dim_head=d)
    elif impl == "hf":
        mod = HFSelfAttention(e, heads=h, landmarks=m, n=n)
    else:
        mod = lucidrains_layer(e, heads=h, dim_head=d, landmarks=m)
    mod = mod.to(dtype)
    if mode == "fwd":

        def fwd():
            with torch.no_grad():
                out = mod(x)
            return out[0] if isinstance(out, tuple) else out

        return fwd
    xg = x.clone().requires_grad_()

    def fwdbwd():
        out = mod(xg)
        out = out[0] if isinstance(out, tuple) else out
        out.sum().backward()
        return None

    return fwdbwd


def measure(case: dict) -> dict:
    """One case in this fresh process: ``{"ms", "peak_mb"}`` (our core: + ``"gemm_gflops"``, the floor's
    GEMM rate timed beside it), or for impl ``"gemm"`` the machine's ``{"gflops"}``. ``case``: impl, mode,
    n, heads, dim_head, landmarks, dtype, repeats, budget (seconds of timed calls)."""
    torch.manual_seed(0)
    if case["impl"] == "gemm":
        return {"gflops": gemm_gflops()}
    fn = build_case(
        case["impl"], case["mode"], n=case["n"], h=case["heads"], d=case["dim_head"], m=case["landmarks"],
        dtype=getattr(torch, case["dtype"]),
    )  # fmt: skip
    mem = peak_memory_mb(fn)  # the first call doubles as warm-up
    timing = dict(repeats=case["repeats"], budget_s=case["budget"], warmup=WARMUP_CALLS - 1)
    if case["impl"] == "nystrom" and case["mode"] == "core":  # the floor's GEMM rate, timed beside our core
        ms, rate = median_time_and_gemm_rate(fn, **timing)
        return {"ms": ms, "peak_mb": mem, "gemm_gflops": rate}
    return {"ms": median_time_ms(fn, **timing), "peak_mb": mem}


def _skip(impl: str, mode: str, n: int, max_sdpa_n: int) -> bool:
    return impl == "sdpa" and n > max_sdpa_n


def run(
    *,
    lengths: list[int],
    impls: tuple[str, ...] = IMPLS,
    modes: tuple[str, ...] = MODES,
    heads: int = 8,
    dim_head: int = 64,
    landmarks: int | None = None,
    dtype: str = "float32",
    repeats: int = 5,
    max_sdpa_n: int = 16384,
    out_dir: Path = Path("runs/bench"),
    markdown: Path | None = Path("runs/bench/benchmarks.md"),
) -> list[dict]:
    """Run every (impl, mode, n) case in a fresh process; write CSV + markdown; return the rows. ``landmarks``
    None: NystromAttention's default m."""
    from tqdm import tqdm

    landmarks = OURS["num_landmarks"] if landmarks is None else landmarks
    gemm = run_case(_TARGET, {"impl": "gemm"}, timeout_s=300)["gflops"]
    common = {
        "heads": heads,
        "dim_head": dim_head,
        "landmarks": landmarks,
        "dtype": dtype,
        "repeats": repeats,
    }
    cases = [(i, mo, n) for n in lengths for mo in modes for i in impls if not _skip(i, mo, n, max_sdpa_n)]
    rows = []
    for impl, mode, n in tqdm(cases, desc="attention bench", unit="case"):
        case = {"impl": impl, "mode": mode, "n": n, **common, "budget": 20.0}
        res = run_case(_TARGET, case, timeout_s=1800)
        rows.append({"impl": impl, "mode": mode, "n": n, **res})
    gemm_after = run_case(_TARGET, {"impl": "gemm"}, timeout_s=300)["gflops"]
    info = {**machine_info(), "gemm_gflops_before": f"{gemm:.1f}", "gemm_gflops_after": f"{gemm_after:.1f}"}
    settings = {"heads": heads, "dim_head": dim_head, "landmarks": landmarks, "dtype": dtype}
    report = render(rows, info, **settings)
    print(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    # what the report needs beside the rows, so `nystrom docs render` can rebuild it from the files
    meta = {"source": "nystrom bench core", "info": info, "settings": settings}
    (out_dir / "bench_attention.json").write_text(json.dumps(meta, indent=1) + "\n")
    with open(out_dir / "bench_attention.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["impl", "mode", "n", "ms", "peak_mb", "gemm_gflops", "error"])
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in w.fieldnames})
    if markdown is not None:
        replace_section(markdown, "bench-attention", report)
    return rows
