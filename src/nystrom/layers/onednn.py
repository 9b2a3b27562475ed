"""Which dtypes oneDNN's fused linear can run on this CPU: probed once per dtype, never raising.

Why a probe: oneDNN's kernels exist per instruction set. Its bf16 inner product needs AVX-512 (``avx512_core``
and up) or AVX2 with the VNNI-2 extension, so on an AVX2-only CPU (most AMD EPYC and Ryzen before Zen 4,
Intel laptops before 2023) ``torch.ops.mkldnn._linear_pointwise`` in bf16 raises "could not create a
primitive descriptor for the inner product forward propagation primitive". The ISA oneDNN uses may also be
lowered below the hardware's by ``ONEDNN_MAX_CPU_ISA`` (read once, at oneDNN's first call). A tiny call of
the op itself, in the dtype and with every post-op :func:`~nystrom.layers.dense.dense` uses, answers
for exactly the ISA oneDNN runs with, whatever set it; PyTorch's own flag
(``torch.ops.mkldnn._is_mkldnn_bf16_supported``, where present) must agree as well.

The answer per dtype is cached: the ISA cannot change inside a process. ``torch.backends.mkldnn.enabled``
(``torch.backends.mkldnn.flags(enabled=False)``, PyTorch's switch for its oneDNN paths) is read on every
call, so a user or a test can turn the fused path off at any time; the plain ``F.linear`` path then runs.
"""

from __future__ import annotations

import threading

import torch

#: our activation names -> oneDNN's post-op (attr, algorithm)
POST_OPS = {None: ("none", ""), "gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"), "relu": ("relu", "")}
#: the dtypes the fused linear is ever tried in (float16 and float64 always take ``F.linear``)
CANDIDATE_DTYPES = (torch.float32, torch.bfloat16)

_lock = threading.Lock()
_probed: dict[torch.dtype, bool] = {}


def built_with_linear() -> bool:
    """Whether this PyTorch has oneDNN and its fused linear op at all (a build fact, not a CPU fact)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


_BUILT = built_with_linear()


def _torch_flag(dtype: torch.dtype) -> bool:
    """PyTorch's own answer for bf16 where it exposes one (True for fp32, or where it has no such flag)."""
    fn = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None) if dtype == torch.bfloat16 else None
    if fn is None:
        return True
    try:
        return bool(fn())
    except RuntimeError:
        return False


def _probe(dtype: torch.dtype) -> bool:
    """One tiny fused linear per post-op in ``dtype``, on tensors of our own, outside autograd and autocast.
    Any error (the ISA lacks the kernel, the op's schema changed) means: not supported."""
    if not _BUILT or not _torch_flag(dtype):
        return False
    x = torch.linspace(-1.0, 1.0, 4 * 8).reshape(4, 8).to(dtype)  # (r, i)
    w = torch.linspace(-0.5, 0.5, 16 * 8).reshape(16, 8).to(dtype)  # (o, i)
    b = torch.linspace(-0.1, 0.1, 16).to(dtype)  # (o,)
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            for attr, algorithm in POST_OPS.values():
                y = torch.ops.mkldnn._linear_pointwise(x, w, b, attr, [], algorithm)  # (r, o)
                if y.shape != (4, 16) or y.dtype != dtype:
                    return False
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


def linear_supports(dtype: torch.dtype) -> bool:
    """Whether :func:`~nystrom.layers.dense.dense` may run oneDNN's fused linear in ``dtype`` here: the
    build has it, ``torch.backends.mkldnn.enabled`` is on, and a probe in that dtype ran on this CPU (its
    result cached). Never raises."""
    if dtype not in CANDIDATE_DTYPES or not _BUILT or not torch.backends.mkldnn.enabled:
        return False
    ok = _probed.get(dtype)
    if ok is None:
        with _lock:
            ok = _probed.get(dtype)
            if ok is None:
                ok = _probed[dtype] = _probe(dtype)
    return ok


def linear_compute_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The dtype the fused linear computes a ``dtype`` result in on this CPU, or None where it cannot run.

    ``dtype`` itself where :func:`linear_supports` it. For bfloat16 on a CPU whose oneDNN runs only float32
    (AVX2 without VNNI-2, or ``ONEDNN_MAX_CPU_ISA`` below AVX-512): float32, the result rounded to bfloat16.
    Why: there no bf16 GEMM kernel exists in oneDNN or ATen; a whole MiniLM-size model at 4096 tokens in
    bf16 measured 7.5× slower than in fp32 (docs/cpu.md), while an fp32 GEMM of bf16 operands is exact
    and its rounded result is within bf16's own rounding of the bf16 GEMM's. Never raises."""
    if linear_supports(dtype):
        return dtype
    if dtype == torch.bfloat16 and linear_supports(torch.float32):
        return torch.float32
    return None
