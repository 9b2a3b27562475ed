"""What the fused stage's parts share: the setting, the inputs, the clocks, the guard and the writer.

Legend: b batch (1), h heads, n tokens, d head dim, m landmarks, K conv taps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from nystrom_lab.bench.measure import cuda_median_time_ms

#: the fused kernels' names, as the profiler and ``launch.LAUNCHES`` see them
KERNELS = ("landmarks", "landmark_pinv", "key_pass", "key_combine", "query_pass", "query_backward",
           "landmark_backward", "key_backward", "query_landmarks")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Setting:
    """One run's sizes: the issue's targets on a GPU, tiny ones under Triton's interpreter (dry)."""

    device: str
    dtype: torch.dtype
    heads: int
    dim_head: int
    landmarks: int
    taps: int  # the conv skip's K (0: off)
    lengths: tuple[int, ...]
    reps: int  # timed calls per measurement (median)
    long: tuple[int, int, int, int]  # the 2³¹ check: n, h, d, last rows compared
    dry: bool

    def describe(self) -> dict:
        return {"device": self.device, "dtype": str(self.dtype).removeprefix("torch."), "batch": 1,
                "heads": self.heads, "dim_head": self.dim_head, "landmarks": self.landmarks,
                "conv_taps": self.taps, "lengths": list(self.lengths), "reps": self.reps,
                "dry": self.dry}  # fmt: skip


GPU = Setting("cuda", torch.bfloat16, 8, 64, 64, 33, (4096, 16384), 10, (180_000, 32, 128, 1024), False)
DRY = Setting("cpu", torch.bfloat16, 2, 16, 16, 5, (128,), 2, (192, 2, 32, 64), True)


def setting(dry: bool) -> Setting:
    return DRY if dry else GPU


def projection(n: int, h: int, d: int, dtype: torch.dtype, device: str, *, grad: bool = False, seed: int = 0):
    """(proj, q, k, v): q, k, v (1, h, n, d) are head views of one (1, n, 3·h·d) projection in the
    modules' (3, h, d) layout, so their token stride is 3·h·d (what the kernels read at long n)."""
    torch.manual_seed(seed)
    proj = torch.randn(1, n, 3 * h * d, device=device, dtype=dtype).requires_grad_(grad)
    q, k, v = proj.view(1, n, 3, h, d).permute(2, 0, 3, 1, 4)
    return proj, q, k, v


def conv_weight(h: int, taps: int, dtype: torch.dtype, device: str) -> torch.Tensor | None:
    """The conv skip's weight (h, K) in the inputs' dtype, as the module holds it; None without taps."""
    if not taps:
        return None
    torch.manual_seed(1)
    return (torch.randn(h, taps, device=device) / taps).to(dtype)


def attention(q, k, v, w, m: int) -> torch.Tensor:
    from nystrom import nystrom_attention

    return nystrom_attention(q, k, v, num_landmarks=m, conv_weight=w)


def fused(enabled: bool = True):
    """``fused_kernels(enabled)``: on the CPU the kernels run under Triton's interpreter (dry runs)."""
    from nystrom.ops.nystrom.fused import fused_kernels

    return fused_kernels(enabled)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def flush_buffer(device: str) -> torch.Tensor | None:
    """256 MB to write before each timed kernel: the L2 cache starts cold, and the GPU is busy while the
    host enqueues the timed launch (its launch overhead is not timed), as ``triton.testing.do_bench``."""
    return torch.empty(256 * 2**20, dtype=torch.int8, device="cuda") if device == "cuda" else None


def timed_ms(fn: Callable[[], object], device: str, reps: int, *, warmup: int = 1,
             flush: torch.Tensor | None = None) -> float:  # fmt: skip
    """Median ms of ``fn`` over ``reps`` calls: CUDA events around each call on a GPU (after writing
    ``flush`` if given: :func:`~nystrom_lab.bench.measure.cuda_median_time_ms`), the wall clock on the CPU."""
    if device == "cuda":
        return cuda_median_time_ms(fn, repeats=reps, warmup=warmup, flush=flush)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


class Clock:
    """The stage's deadline (a ``time.monotonic()`` value; the same clock in every process of the machine)."""

    def __init__(self, until: float) -> None:
        self.until = until

    def left(self, margin: float = 0.0) -> float:
        return self.until - time.monotonic() - margin


def guarded(record: dict, fn: Callable[[], dict | None]) -> dict:
    """``record`` updated with ``fn()``'s dict, or with the error's text (the stage goes on), and the
    seconds it took."""
    start = time.monotonic()
    try:
        record.update(fn() or {})
    except Exception as err:  # any failure is a finding: recorded, and the next part runs
        record["error"] = f"{type(err).__name__}: {err}"[:3000]
        record["traceback"] = traceback.format_exc()[-4000:]
    record["wall_s"] = round(time.monotonic() - start, 2)
    return record


def environment(s: Setting) -> dict:
    """The machine and the software, beside every file."""
    import importlib.metadata

    info = {"setting": s.describe(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        info["triton"] = None
    if s.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}",
                 "multiprocessors": props.multi_processor_count,
                 "gpus": torch.cuda.device_count()}  # fmt: skip
    else:
        info["gpu"] = "none (dry run: CPU, Triton's interpreter)"
    info["interpreted"] = os.environ.get("TRITON_INTERPRET") == "1"
    return info


def write(out: Path, name: str, data: dict) -> Path:
    """``out/fused_{name}.json``, written whole (a temporary file renamed: a killed stage leaves the last
    one)."""
    path = out / f"fused_{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def read(out: Path, name: str) -> dict:
    path = out / f"fused_{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}
