"""Tile sizes, split counts and the one launch helper of the fused kernels.

Legend: n tokens, BH programs rows (b·h), BN token block.

Every Triton launch goes through :func:`launch`, which counts it: the tests hold the launches per call to
the issue's budget (≤ 6 kernels forward, ≤ 16 forward and backward, ATen ops included).
"""

from __future__ import annotations

import collections
import os

import torch

#: launches per kernel name since the process started (read by the tests and the GPU script)
LAUNCHES: collections.Counter[str] = collections.Counter()

#: programs per (b, h) row the split passes aim at, times the device's multiprocessors
_WAVES = 2


def block(size: int) -> int:
    """A tile side for ``size``: the next power of two, at least 16 (``tl.dot``'s smallest)."""
    return max(16, 1 << (size - 1).bit_length())


def dot_options(dtype: torch.dtype) -> dict[str, object]:
    """The large products' ``tl.dot`` options for inputs of ``dtype``: ``DOT``, the operands' dtype, and
    ``PRECISION``: IEEE for float32 (PyTorch's matmuls default to it; TF32 would round to 10 bits).

    Under Triton's interpreter bfloat16 operands are multiplied as float32 (exact products and float32
    sums, what the tensor cores compute): Triton 3.9's interpreter multiplies bfloat16 tiles' bit
    patterns as integers (numpy has no bfloat16)."""
    import triton.language as tl

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if dtype == torch.float32 or (interpreted and dtype == torch.bfloat16):
        return {"DOT": tl.float32, "PRECISION": "ieee"}
    return {"DOT": {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype], "PRECISION": "tf32"}


def splits(n: int, bh: int, bn: int, device: torch.device) -> tuple[int, int]:
    """(tokens per split, splits) for the passes that cut n: enough programs for ``_WAVES`` waves over
    the device's multiprocessors, each split a whole number of ``bn`` blocks."""
    units = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    want = max(1, -(-_WAVES * units // bh))  # splits per (b, h)
    blocks = -(-n // bn)
    per_split = -(-blocks // min(want, blocks)) * bn
    return per_split, -(-n // per_split)


#: warps of the one-program-per-head kernels at m ≥ 64 (the others take Triton's default, 4): the m×m tiles
#: of A, its iterates and their gradients need the registers of more threads. Chosen from the spill stack
#: that ``python -m nystrom_lab.bench.gpu.kernel_resources`` reads from kernels compiled for sm_90 (no GPU
#: yet to time them): key_combine 1596 -> 224 B per thread with 8 warps, landmark_backward 45 -> 10 KB with 16.
_WARPS = {"landmark_pinv": 8, "key_combine": 8, "landmark_backward": 16}
#: the token-block kernels whose products run as IEEE float32 FMAs (float32 inputs) at m ≥ 64: with 4 warps
#: their (64, 64) tiles spilled 6-12 KB per thread
_FLOAT32_DOTS = ("key_pass", "query_pass", "query_backward", "key_backward")


def warps(kernel: str, bm: int, dtype: torch.dtype | None = None) -> int:
    """``num_warps`` for ``kernel`` at the landmark tile ``bm`` (and inputs of ``dtype``)."""
    if bm < 64:
        return 4
    if dtype == torch.float32 and kernel in _FLOAT32_DOTS:
        return 8
    return _WARPS.get(kernel, 4)


def launch(kernel, grid: tuple[int, ...], *args, **meta) -> None:
    """``kernel[grid](*args, **meta)``, counted in :data:`LAUNCHES`."""
    LAUNCHES[kernel.__name__] += 1
    kernel[grid](*args, **meta)
