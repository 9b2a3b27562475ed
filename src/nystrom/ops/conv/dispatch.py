"""The conv skip's entry points: :func:`conv_skip` and :func:`add_conv_skip`, and the op's ONE choice of
implementation (:func:`~nystrom.ops.conv.banded.conv_path`, beside the CPU kernels that ask it too).

Legend: b batch, h heads, n tokens, d head dim, K kernel length (odd).

``out[b, h, t] = Σ_j w[h, j] · v[b, h, t + j − K // 2]`` (zero outside the sequence): the Nyströmformer's
skip connection, ``nn.Conv2d(h, h, (K, 1), padding=(K // 2, 0), groups=h, bias=False)`` on (b, h, n, d).
The reference is :mod:`.naive`; the CPU's banded GEMMs are :mod:`.banded`. Nyström attention's fused
kernels add the skip inside their query pass instead (:mod:`nystrom.ops.nystrom.fused`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nystrom.ops.conv.banded import BLOCK_ROWS, _check, conv_path, depthwise_seq_conv, depthwise_seq_conv_add_


def conv_skip(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The depthwise conv skip ``Conv2d(h, h, (K, 1), padding=(K // 2, 0), groups=h, bias=False)`` of v.

    v (b, h, n, d), weight (h, 1, K, 1) -> (b, h, n, d) in v's dtype. Eagerly as banded GEMMs
    (:func:`depthwise_seq_conv`, faster on CPU); traced, as K shifted multiply-adds that the compiler
    fuses into one loop (the GEMMs' strided views, and inductor's CPU conv2d, would pin n to one value).
    On the accelerator path, one ``F.conv2d`` (cuDNN's depthwise kernel; it wants a contiguous input); under
    ``torch.export`` too (one ONNX ``Conv``, whose length stays dynamic).
    """
    path = conv_path(v)
    if path in ("accelerator", "exported"):
        h, k = weight.shape[0], weight.shape[2]
        return F.conv2d(v.contiguous(), weight.to(v.dtype), padding=(k // 2, 0), groups=h)  # (b, h, n, d)
    if path == "cpu":
        return depthwise_seq_conv(v, weight)
    h, k, n = weight.shape[0], weight.shape[2], v.shape[2]
    w = weight.to(v.dtype).view(1, h, k, 1)  # (1, h, K, 1)
    vp = F.pad(v, (0, 0, k // 2, k // 2))  # (b, h, n + K − 1, d)
    return sum(vp[:, :, j : j + n] * w[:, :, j : j + 1] for j in range(k))  # (b, h, n, d)


def add_conv_skip(o: torch.Tensor, v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``o + conv_skip(v, weight)``, o and v (b, h, n, d). Without autograd, eagerly on CPU, the conv is
    added into ``o`` where o is the core's own fresh result (not sharing memory with v, hence with the
    q/k/v projection): no (b, h, n, d) conv tensor and no separate add (inference)."""
    if torch.is_grad_enabled() or conv_path(v) != "cpu":  # traced first: dynamo has no storages
        # o first: the sum keeps o's (b, n, h, d) layout (SDPA's), so the head merge is a view
        return o + conv_skip(v, weight)
    own = (
        o.dtype == v.dtype
        and o.shape == v.shape
        and o.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
    )
    return depthwise_seq_conv_add_(o, v, weight) if own else o + conv_skip(v, weight)


def conv_taps(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The (h, K) taps of a conv skip ``weight`` ((h, 1, K, 1) or (h, K), K odd) for v (b, h, n, d), checked."""
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(f"conv_weight must be a floating-point tensor, got {type(weight).__name__}")
    if weight.dim() == 4 and (weight.shape[1], weight.shape[3]) != (1, 1):
        raise ValueError(f"conv_weight must be (heads, 1, K, 1) or (heads, K), got {tuple(weight.shape)}")
    return _check(v, weight, BLOCK_ROWS)
