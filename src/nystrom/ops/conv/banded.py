"""The conv skip's CPU implementation: the depthwise convolution of V over the sequence as banded GEMMs
(the op's reference is :mod:`.naive`, its dispatch :mod:`.dispatch`).

Legend: b batch, h heads, n tokens, d head dim, K kernel length (odd), P = K // 2, c block rows,
nb = ⌈n / c⌉ blocks, W = c + K − 1 rows of one block's window.

``out[b, h, t] = Σ_j w[h, j] · v[b, h, t + j − P]`` (zero outside 0 ≤ t + j − P < n): what
``nn.Conv2d(h, h, (K, 1), padding=(P, 0), groups=h, bias=False)`` computes on (b, h, n, d).

Why not that Conv2d: on CPU its depthwise kernel is slow (measured on the 2-core VM, b=32 h=2 n=2000
d=32 K=35: 0.18 s forward, 0.5 s forward+backward, half of an LRA ListOps training step). Here the
sequence is cut into blocks of c rows; block i of the output is ``T_h @ V[i·c − P : i·c + c + P]`` with
the (c, W) Toeplitz matrix ``T_h[r, r + j] = w[h, j]``. Stacking all blocks of a sample side by side,
one GEMM ``(c, W) @ (W, nb·d)`` per (sample, head) gives every output row; the backward is the same
product with the flipped kernel for ∂v, and ``∂T = ∂Y @ Xᵀ`` summed along its diagonals for ∂w.
Cost: 2·W·n·d FLOPs per (sample, head), a few times the direct K·n·d but all in one GEMM. Large
inputs go through in groups of heads (``GROUP_BYTES``) to bound the temporaries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nystrom.utils.amp import autocast_off
from nystrom.utils.device import accelerator_path

BLOCK_ROWS = 64  # c: measured best of 32/64/128 for K = 35 on the 2-core VM
# One product holds ≈ 4.5x its input in temporaries (padded copy, windows, result, its reshape); above
# this many input bytes the heads go through in groups. Small groups also keep those temporaries warm in
# cache and out of fresh mmap'd pages: interleaved A/B on the 2-core AMD VM, b=1 h=8 d=64 K=33, fwd+bwd
# 32 MiB -> 2 MiB groups: n=6000 25 -> 14 ms, n=16384 137 -> 52 ms, n=65536 686 -> 279 ms; LRA's b=32
# h=2 n=2000 d=32 23.5 -> 20.9 ms (1 MiB: level with 2 MiB).
GROUP_BYTES = 2 << 20


def conv_path(x: torch.Tensor) -> str:
    """The conv skip's one choice of implementation for ``x`` (b, h, n, d), and the only place that asks:

    ``"exported"`` under torch.export (one ``F.conv2d``: ONNX's ``Conv``, one depthwise kernel in ONNX Runtime;
    the K shifted multiply-adds were half of its time, MiniLM size with K = 65 at 4K tokens),
    ``"traced"`` under torch.compile (K shifted multiply-adds that the compiler fuses into one loop),
    ``"accelerator"`` on the accelerator path (one ``F.conv2d``, cuDNN's depthwise kernel), else ``"cpu"``
    (the banded GEMMs below, in cache-sized groups of heads, added in place in inference)."""
    if torch.compiler.is_exporting():
        return "exported"
    if torch.compiler.is_compiling():
        return "traced"
    return "accelerator" if accelerator_path(x) else "cpu"


def _head_groups(x: torch.Tensor) -> list[slice]:
    """Slices of heads whose (b, ·, n, d) part of ``x`` stays under ``GROUP_BYTES`` (at least one head).
    Off the CPU path one group: the groups keep CPU caches warm, on a GPU each is more launches."""
    b, h, n, d = x.shape
    if conv_path(x) != "cpu":
        return [slice(0, h)]
    per_head = max(1, b * n * d * x.element_size())
    g = max(1, min(h, GROUP_BYTES // per_head))
    return [slice(i, i + g) for i in range(0, h, g)]


def _band(t: torch.Tensor, k: int) -> torch.Tensor:
    """(h, c, W) contiguous -> its (h, c, K) band view ``band[:, r, j] = t[:, r, r + j]``."""
    h, c, width = t.shape
    return t.as_strided((h, c, k), (c * width, width + 1, 1))


def _toeplitz(w: torch.Tensor, c: int) -> torch.Tensor:
    """(h, K) kernel -> (h, c, W) banded matrix with ``T[:, r, r + j] = w[:, j]``."""
    h, k = w.shape
    t = w.new_zeros(h, c, c + k - 1)
    _band(t, k).copy_(w[:, None, :].expand(h, c, k))
    return t


def _windows(x: torch.Tensor, k: int, c: int) -> torch.Tensor:
    """(b, h, n, d) -> (b, h, W, nb·d): column block i holds rows i·c − P … i·c + c + P − 1 (zero-padded)."""
    b, h, n, d = x.shape
    nb = -(-n // c)
    p = k // 2
    xp = F.pad(x, (0, 0, p, nb * c + k - 1 - p - n)).contiguous()  # (b, h, nb·c + K − 1, d)
    width = c + k - 1
    length = xp.shape[2]
    win = xp.as_strided((b, h, width, nb, d), (h * length * d, length * d, d, c * d, 1))
    return win.reshape(b, h, width, nb * d)  # one copy, ≈ W/c times x


def _conv_group(x: torch.Tensor, w: torch.Tensor, c: int, out: torch.Tensor, *, add: bool = False) -> None:
    """The forward product for one group of heads, into ``out`` (added to it with ``add``): x (b, g, n, d),
    w (g, K) -> out (b, g, n, d)."""
    b, g, n, d = x.shape
    nb, full = -(-n // c), n // c
    y = torch.matmul(_toeplitz(w, c), _windows(x, w.shape[1], c)).view(b, g, c, nb, d)  # row r of block i
    whole = out[:, :, : full * c].unflatten(2, (full, c))
    (whole.add_ if add else whole.copy_)(y[:, :, :, :full].transpose(2, 3))  # whole blocks
    if full < nb:
        last = out[:, :, full * c :]
        (last.add_ if add else last.copy_)(y[:, :, : n - full * c, full])  # the ragged last block


def _conv(x: torch.Tensor, w: torch.Tensor, c: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The forward product: x (b, h, n, d), w (h, K) -> (b, h, n, d), head group by head group; with
    ``out`` given, added into it."""
    add = out is not None
    out = x.new_empty(x.shape) if out is None else out
    for hs in _head_groups(x):
        _conv_group(x[:, hs], w[hs], c, out[:, hs], add=add)
    return out


def _weight_grad(x: torch.Tensor, go: torch.Tensor, k: int, c: int) -> torch.Tensor:
    """∂w (h, K) from x and ∂y (b, h, n, d): ∂T = Σ_b ∂Y Xᵀ per head, summed along its diagonals."""
    b, h, n, d = x.shape
    nb = -(-n // c)
    dw = x.new_empty(h, k)
    for hs in _head_groups(x):
        gop = F.pad(go[:, hs], (0, 0, 0, nb * c - n))  # (b, g, nb·c, d)
        g_ = gop.shape[1]  # explicit, not -1: b = 0 leaves -1 ambiguous
        g = gop.reshape(b, g_, nb, c, d).transpose(2, 3).reshape(b, g_, c, nb * d)  # (b, g, c, nb·d)
        dt = torch.matmul(g, _windows(x[:, hs], k, c).mT).sum(0)  # (g, c, W)
        dw[hs] = _band(dt, k).sum(1)  # (g, K): diagonal sums
    return dw


class _SeqConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, c):
        ctx.save_for_backward(x, w)
        ctx.c = c
        return _conv(x, w, c)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, go):
        x, w = ctx.saved_tensors
        c = ctx.c
        go = go.contiguous()
        dx = _conv(go, w.flip(-1), c) if ctx.needs_input_grad[0] else None  # the adjoint: flipped kernel
        dw = _weight_grad(x, go, w.shape[1], c) if ctx.needs_input_grad[1] else None
        return dx, dw, None


def _check(x: torch.Tensor, weight: torch.Tensor, block_rows: int) -> torch.Tensor:
    """The (h, K) kernel of ``weight`` after checking x (b, h, n, d), the kernel and ``block_rows``."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must have shape (batch, heads, tokens, head_dim), got {shape}")
    w = weight.reshape(weight.shape[0], -1) if weight.dim() == 4 else weight
    if w.dim() != 2 or w.shape[0] != x.shape[1] or w.shape[1] % 2 == 0:
        raise ValueError(
            f"weight must be (heads={x.shape[1]}, K) with K odd (or (heads, 1, K, 1)), got {tuple(weight.shape)}"
        )
    if not isinstance(block_rows, int) or block_rows < 1:
        raise ValueError(f"block_rows must be a positive int, got {block_rows!r}")
    return w


def depthwise_seq_conv_add_(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, *, block_rows: int = BLOCK_ROWS
) -> torch.Tensor:
    """``out += depthwise_seq_conv(x, weight)`` in place, without autograd (inference).

    Why: the skip is added to the attention output anyway; adding each block's product where it
    belongs allocates no (b, h, n, d) result and skips one pass over it (at n = 16384, MiniLM size, a
    25 MB tensor per layer). ``out`` (b, h, n, d) in x's dtype, any strides, not overlapping x.
    Raises where autograd would record (use ``out + depthwise_seq_conv(x, weight)`` there).
    """
    w = _check(x, weight, block_rows)
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or out.requires_grad):
        raise RuntimeError("depthwise_seq_conv_add_ is for inference: call it under torch.no_grad() or "
                           "torch.inference_mode(), or use out + depthwise_seq_conv(x, weight)")  # fmt: skip
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out must match x: {tuple(x.shape)} {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    with torch.no_grad(), autocast_off(x.device.type):
        _conv(x, w.to(x.dtype), block_rows, out)
    return out


def depthwise_seq_conv(
    x: torch.Tensor, weight: torch.Tensor, *, block_rows: int = BLOCK_ROWS
) -> torch.Tensor:
    """Per-head depthwise convolution along the tokens with zero "same" padding.

    Args:
        x: (b, h, n, d), any strides and floating dtype.
        weight: (h, K) with K odd (an ``nn.Conv2d(h, h, (K, 1), groups=h)`` weight (h, 1, K, 1) also works).
        block_rows: c, rows per GEMM block (performance only).

    Returns:
        (b, h, n, d) in ``x``'s dtype (the weight is cast to it; autocast does not apply).
    """
    w = _check(x, weight, block_rows)
    with autocast_off(x.device.type):
        return _SeqConv.apply(x, w.to(x.dtype), block_rows)
