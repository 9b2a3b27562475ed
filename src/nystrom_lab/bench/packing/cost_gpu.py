"""What packing costs on a GPU: a packed row of n tokens against the same n tokens as one document, through
the fused Triton kernels (CUDA's default) and through the PyTorch path, in one process.

Legend: n tokens of the row, D documents in it, m landmarks, h heads, d head dim.

``python -m nystrom_lab.bench.gpu.driver packing OUT`` (a stage of ``scripts/gpu_bench.sh``) times one
``NystromAttention`` layer in the fused stage's setting (:data:`LAYER`: bf16, h = 8, d = 64, m = 64, the conv
skip's 33 taps: the kernels compiled by the stages before serve it) at n = 4096 and 16384, forward (no autograd)
and forward + backward, for the layouts of :mod:`.cost` plus a skewed one (half the row one document, the
rest 64 short ones): the fused kernels take every document as a sample in its own span of the row, so a
short document costs its own blocks, while the PyTorch path pads every document to the longest (D·L token
rows). Device time by CUDA events, median of ``reps``, layouts interleaved round by round; each time is
also given as a ratio to the one-document time of the same path. ``dry``: the CPU under Triton's
interpreter at n = 128, :data:`DRY_LAYER`, :data:`DRY_LAYOUTS` (the times mean nothing).
"""

from __future__ import annotations

import statistics
import time

import torch

from nystrom import NystromAttention
from nystrom_lab.bench.packing.cost import cu_seqlens_of, layouts

LENGTHS = (4096, 16384)
#: the layer (width, heads, head dim, landmarks, conv taps): the fused stage's on a GPU, tiny when dry
LAYER = {"width": 512, "heads": 8, "dim_head": 64, "landmarks": 64, "conv_taps": 33}
DRY_LAYER = {"width": 32, "heads": 2, "dim_head": 16, "landmarks": 16, "conv_taps": 5}
DRY_LENGTHS = (128,)
#: a dry run's layouts (the interpreter runs a program at a time: few documents)
DRY_LAYOUTS = ("one document", "4 equal", "half + 4 short")
#: the skewed layout's short documents
SHORT_DOCUMENTS = 64
PATHS = ("fused", "pytorch")


def gpu_layouts(n: int, *, dry: bool = False) -> dict[str, list[int]]:
    """:func:`.cost.layouts` and the skewed one (n/2, then 64 documents sharing the rest); ``dry``: only
    :data:`DRY_LAYOUTS`, the skewed one with 4 short documents."""
    count = 4 if dry else SHORT_DOCUMENTS
    skewed = [n // 2] + [(n - n // 2) // count] * (count - 1)
    skewed.append(n - sum(skewed))
    every = {**layouts(n), f"half + {count} short": skewed}
    return {k: every[k] for k in DRY_LAYOUTS} if dry else every


def _timer(device: torch.device):
    """(start, stop -> ms): CUDA events on a GPU (read after one synchronize), else the host clock."""
    if device.type == "cuda":

        def start():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e

        def stop(e0):
            e1 = torch.cuda.Event(enable_timing=True)
            e1.record()
            return lambda: e0.elapsed_time(e1)

        return start, stop

    def host_stop(t0: float):
        elapsed = 1e3 * (time.perf_counter() - t0)
        return lambda: elapsed

    return time.perf_counter, host_stop


def measure(n: int, *, device: torch.device, dtype: torch.dtype, train: bool, reps: int, deadline: float,
            shape: dict[str, int]) -> dict[str, dict[str, float]]:  # fmt: skip
    """Median ms per call, per path and layout, interleaved; rounds stop at ``deadline`` (monotonic)."""
    from nystrom.ops.nystrom.fused import fused_kernels

    torch.manual_seed(0)
    layer = NystromAttention(shape["width"], heads=shape["heads"], dim_head=shape["dim_head"],
                             num_landmarks=shape["landmarks"], conv_kernel_size=shape["conv_taps"])  # fmt: skip
    layer = layer.to(device=device, dtype=dtype)
    x = torch.randn(1, n, shape["width"], device=device, dtype=dtype, requires_grad=train)
    dry = device.type != "cuda"
    cases = {name: (None if len(ls) == 1 else cu_seqlens_of(ls).to(device)) for name, ls in gpu_layouts(n, dry=dry).items()}

    def call(cu: torch.Tensor | None) -> None:
        if train:
            layer(x, cu_seqlens=cu).float().sum().backward()
        else:
            with torch.no_grad():
                layer(x, cu_seqlens=cu)

    start, stop = _timer(device)
    pending: dict[tuple[str, str], list] = {(p, c): [] for p in PATHS for c in cases}
    for rnd in range(reps + 1):  # round 0 warms up (and compiles)
        if rnd > 1 and time.monotonic() > deadline:
            break
        for path in PATHS:
            with fused_kernels(path == "fused"):
                for name, cu in cases.items():
                    t0 = start()
                    call(cu)
                    if rnd:
                        pending[(path, name)].append(stop(t0))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {p: {c: statistics.median(f() for f in pending[(p, c)]) for c in cases if pending[(p, c)]}
            for p in PATHS}  # fmt: skip


def run(*, dry: bool, until: float) -> dict:
    """Every length and mode within ``until`` (monotonic); the record of ``packing_gpu.json``."""
    from nystrom_lab.bench.measure import machine_info

    device = torch.device("cpu" if dry else "cuda")
    shape = DRY_LAYER if dry else LAYER
    rows, skipped = [], []
    for n in DRY_LENGTHS if dry else LENGTHS:
        for train in (False, True):
            mode = "forward + backward" if train else "forward"
            if time.monotonic() > until - 2:
                skipped.append(f"{n} {mode}")
                continue
            ms = measure(n, device=device, dtype=torch.bfloat16, train=train, reps=1 if dry else 7,
                         deadline=until - 2, shape=shape)  # fmt: skip
            ratio = {p: {c: round(t / ms[p]["one document"], 3) for c, t in ms[p].items()} for p in ms}
            rows.append({"n": n, "mode": mode, "ms": ms, "over_one_document": ratio})
            print(n, mode, ratio)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"machine": {**machine_info(), "gpu": gpu}, "setting": {"dtype": "bfloat16", **shape, "dry": dry},
            "rows": rows, **({"skipped": f"over the stage's time budget: {skipped}"} if skipped else {})}


def table(record: dict) -> str:
    """The record as a markdown table: ms and the ratio to one document, per path."""
    names = list(gpu_layouts(4096, dry=record["setting"]["dry"]))
    out = ["| n | mode | path | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for r in record["rows"]:
        for path, ms in r["ms"].items():
            base = ms.get("one document")
            cells = [f"{ms[c]:.2f} ms ({ms[c] / base:.2f}×)" if c in ms and base else "—" for c in names]
            out.append(f"| {r['n']} | {r['mode']} | {path} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
