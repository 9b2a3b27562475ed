"""Nyström attention, forward and backward, in fused Triton kernels (flash-linear-attention's layout).

Read top-down: :mod:`.plan` (what the mask determines), :mod:`.forward` (five kernels), :mod:`.backward`
(four kernels and a sum), :mod:`.op` (the ``torch.library`` op with its fake kernels, autograd and
autocast rule), :mod:`.launch` (tile sizes and the counted launch). The maths is the reference's
(:mod:`nystrom.ops.nystrom.naive`); :func:`covers` says which calls the kernels take, and
:func:`~nystrom.ops.nystrom.dispatch.nystrom_attention` sends those here and the rest to the PyTorch paths.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim.

Where they run: on CUDA (Ampere or newer) when Triton is installed, and on the meta device (the op's
fake kernel: counting ops). On CPU tensors only inside :func:`fused_kernels` (``enabled=True``) with ``TRITON_INTERPRET=1``
set before the first call: Triton's interpreter runs them there, for the tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import torch

from nystrom.ops.nystrom.fused import configs
from nystrom.ops.nystrom.fused.launch import LAUNCHES, block
from nystrom.ops.nystrom.fused.op import fused_attention as _op
from nystrom.ops.nystrom.fused.plan import document_plan, plan

__all__ = ["LAUNCHES", "covers", "fused_attention", "fused_kernels"]

#: the largest m (A and the pinv iterates live on chip, one program per head) and head dims (tiles). At
#: m = 128 the per-head kernels spill 72-144 KB per thread and one took over 10 minutes to compile for
#: sm_90 (kernel_resources in the lab): m > 64 runs the PyTorch path until a GPU run tunes them.
MAX_LANDMARKS = 64
MAX_HEAD_DIM = 128
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: the oldest CUDA compute capability the kernels run on (bfloat16 tl.dot needs sm_80)
MIN_CAPABILITY = (8, 0)

_state: dict[str, bool | None] = {"enabled": None}  # None: on where they run (CUDA with Triton, meta)

#: the environment switch that needs no code change: ``NYSTROM_FUSED=0`` runs the PyTorch paths everywhere
ENVIRONMENT = "NYSTROM_FUSED"


def _environment() -> bool | None:
    """``NYSTROM_FUSED``, read when the op is first asked and kept: ``0`` turns the kernels off, ``1`` or
    unset leaves them on where they run; anything else raises (a typo must not silently keep them on)."""
    if "environment" not in _state:
        value = os.environ.get(ENVIRONMENT, "").strip()
        if value not in ("", "0", "1"):
            raise ValueError(f"{ENVIRONMENT} must be 0 (fused kernels off) or 1 (on where they run), got {value!r}")
        _state["environment"] = False if value == "0" else None
    return _state["environment"]


@contextlib.contextmanager
def fused_kernels(enabled: bool) -> Iterator[None]:
    """Within the block, calls the kernels cover use them (``True``; CPU tensors included, run by Triton's
    interpreter, which needs ``TRITON_INTERPRET=1``) or never do (``False``: the PyTorch paths, e.g. to
    compare the two on a GPU)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    if enabled and os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        raise RuntimeError(
            "fused_kernels(True) without a GPU runs Triton's interpreter: set TRITON_INTERPRET=1 in the"
            " environment before the first call"
        )
    before = _state["enabled"]
    _state["enabled"] = enabled
    try:
        yield
    finally:
        _state["enabled"] = before


#: whether Triton is installed (looked up once: a constant is what torch.compile can trace)
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def _capability(device: torch.device) -> tuple[int, int]:
    """The CUDA device's compute capability (``get_device_properties``: torch.compile folds it)."""
    props = torch.cuda.get_device_properties(device)
    return props.major, props.minor


def _shared_per_block(device: torch.device) -> int:
    """The CUDA device's opt-in shared memory per block in bytes: its multiprocessor's less the 1 KB the
    driver reserves per block (A100 163 KB, H100 227 KB, sm_86/sm_89/sm_120 99 KB)."""
    return torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor - 1024


#: the tables' names of the input dtypes (:mod:`.configs`)
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _compiled_within_bounds(q: torch.Tensor, v: torch.Tensor, num_landmarks: int) -> bool:
    """Whether this call's tiles were compiled within the bounds of docs/gpu/kernel_resources.md
    (:mod:`.configs`, from the kernels compiled for every target arch): no kernel spills past its bound
    at its warps (``UNCOVERED``: float32 shapes), and the shared memory fits the GPU (``SHARED``: m > 32
    needs 128-144 KB, more than sm_86, sm_89 and sm_120 have)."""
    # int(): a head dim traced as a symbol is specialised (the tiles are compile-time constants anyway)
    tiles = (block(int(num_landmarks)), block(int(q.shape[-1])), block(int(v.shape[-1])))
    shape = (_DTYPE_NAMES[q.dtype], *tiles)
    if shape in configs.UNCOVERED:
        return False
    need = configs.SHARED.get(shape, 0)
    return need == 0 or need <= _shared_per_block(q.device)


def covers(
    q: torch.Tensor, v: torch.Tensor, *, num_landmarks: int, pinv: str, pinv_init: str
) -> bool:
    """Whether this call runs the fused kernels: the device (above), float16/bfloat16/float32, the
    paper's iterative pinv with per-matrix Z₀, m ≤ :data:`MAX_LANDMARKS`, head dims ≤ :data:`MAX_HEAD_DIM`,
    and on CUDA tiles compiled within the resource bounds (:func:`_compiled_within_bounds`; the meta
    device and Triton's interpreter take every such shape). Anything else runs the PyTorch paths (the
    same function), and so does every call inside ``fused_kernels(False)`` or in a process started with
    ``NYSTROM_FUSED=0``."""
    enabled = _state["enabled"]
    if enabled is None:  # no fused_kernels() block: the environment decides
        enabled = _environment()
    if enabled is False:
        return False
    device = q.device.type
    if device == "meta":  # the op's fake kernel: what CUDA with Triton dispatches
        where = True
    elif device == "cuda":  # Ampere or newer: the bfloat16 products and the tested sm_90 build
        where = TRITON_INSTALLED and _capability(q.device) >= MIN_CAPABILITY
    else:
        where = bool(enabled) and device == "cpu"
    return (
        where
        and q.dtype in DTYPES
        and pinv == "iterative"
        and pinv_init == "per_matrix"
        and num_landmarks <= MAX_LANDMARKS
        and q.shape[-1] <= MAX_HEAD_DIM
        and v.shape[-1] <= MAX_HEAD_DIM
        and q.shape[-2] > 0
        and q.shape[0] * q.shape[1] > 0
        and (device != "cuda" or _compiled_within_bounds(q, v, num_landmarks))
    )


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_landmarks: int,
    mask: torch.Tensor | None,
    pinv_iterations: int,
    segments: str,
    scale: float,
    conv_taps: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """Nyström attention (b, h, n, dv) on checked inputs that :func:`covers` takes, plus the conv skip of
    v with ``conv_taps`` (h, K) if given. Padded positions are never read, so they need no zeroing and
    may hold anything. With ``cu_seqlens`` (packed documents, checked here; balanced segments), every
    document is a sample of its own: its own landmarks, its passes bounded by its span (no padding to the
    longest), the conv skip within it; the same launches as one unpacked call."""
    b, h, n, _ = q.shape
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))  # the kernels' row reads
    if cu_seqlens is None:
        p = plan(mask, b, n, num_landmarks, segments, q.device)
    else:
        p = document_plan(cu_seqlens, mask, b, n, num_landmarks, max_seqlen=max_seqlen)
    w = None if conv_taps is None else conv_taps.contiguous()  # (h, K), read as float32 by the kernels
    return _op(q, k, v, p.seg, p.bounds, p.counts, p.spans, p.length, w, scale, pinv_iterations)
