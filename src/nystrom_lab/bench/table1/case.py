"""One case of the paper's Table 1: a self-attention module, one input, its peak memory and median time.

Legend: b batch, h heads, n tokens, d head dim, e = h·d model width.

:func:`measure` runs one (method, n) case; the driver (:mod:`nystrom_lab.bench.table1.driver`) calls it in a fresh
process per case (:func:`nystrom_lab.bench.harness.run_case`). The first call
measures the peak memory above the level before it (CPU: resident-set high-water mark; CUDA:
``max_memory_allocated``), i.e. the memory the module's call needs beyond its input and weights, and
doubles as the warm-up; then the median of ``repeats`` timed calls.
"""

from __future__ import annotations

import math

import torch

from nystrom.attention import REGISTRY, AttentionBase
from nystrom.ops.nystrom.fused import fused_kernels
from nystrom_lab.bench.measure import median_time_ms, peak_memory_mb
from nystrom_lab.bench.table1 import outside_modules
from nystrom_lab.bench.table1.report import METHODS

EXACT = ("transformer", "sdpa")
DTYPES = ("float32", "bfloat16", "float16", "float64")


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


class PyTorchPath(torch.nn.Module):
    """``module`` with Nyström attention on its PyTorch path (the fused Triton kernels off): the GPU table
    compares the two."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with fused_kernels(False):
            return self.module(x)


def build_module(method: str, *, n: int, heads: int, dim_head: int) -> torch.nn.Module:
    """The attention module of ``method`` (a key of :data:`METHODS`) for inputs of n tokens: an
    :class:`AttentionBase` of ours, or a wrapped outside one (:mod:`nystrom_lab.bench.table1.outside_modules`)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    _, name, opts = METHODS[method]
    e = heads * dim_head
    if name in outside_modules.NEEDS:
        return outside_modules.build(name, n=n, heads=heads, dim_head=dim_head, opts=opts)
    if name == "transformer":
        return MaterializedSoftmaxAttention(e, heads=heads, dim_head=dim_head)
    if name == "nystrom-pytorch":
        return PyTorchPath(REGISTRY["nystrom"](e, heads=heads, dim_head=dim_head, **opts))
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
    mod = build_module(method, n=n, heads=heads, dim_head=dim_head)
    if METHODS[method][1] in outside_modules.AUTOCAST and dtype in (torch.bfloat16, torch.float16):
        mod = outside_modules.Autocast(mod.to(device=device), device, dtype).eval()  # fp32 weights, autocast
    else:
        mod = mod.to(device=device, dtype=dtype).eval()
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


def check_device(device: str) -> None:
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, cuda build "
            f"{torch.version.cuda or 'none'}); use --device cpu"
        )


def measure(case: dict) -> dict:
    """Run one case; ``{"ms", "peak_mb"}``. ``case``: method, n, batch, heads, dim_head, dtype (a name of
    :data:`DTYPES`), device, backward, repeats, budget (seconds of timed calls), threads (0: as set)."""
    check_device(case["device"])
    if case["threads"]:
        torch.set_num_threads(case["threads"])
    torch.manual_seed(0)
    fn = build_case(
        case["method"],
        n=case["n"],
        batch=case["batch"],
        heads=case["heads"],
        dim_head=case["dim_head"],
        dtype=getattr(torch, case["dtype"]),
        device=case["device"],
        backward=case["backward"],
    )
    mem = peak_memory_mb(fn, device=case["device"])  # doubles as the warm-up
    ms = median_time_ms(fn, repeats=case["repeats"], budget_s=case["budget"], warmup=0)
    return {"ms": ms, "peak_mb": mem}
