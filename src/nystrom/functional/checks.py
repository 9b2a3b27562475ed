"""Input validation shared by the functional API and the modules.

Every check raises ``ValueError``/``TypeError`` that names the argument and the expected form:
a wrong shape must never turn into a silent broadcast or a wrong answer.
Legend: b batch, h heads, n tokens, d head dim.
"""

from __future__ import annotations

import math

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise naming the option."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Check ``q, k`` (b, h, n, d) and ``v`` (b, h, n, dv); return ``(b, h, n, d, dv)``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, tokens, head_dim), got {tuple(t.shape)}")
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16/bfloat16/float32/float64, got {t.dtype}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have shape (batch, heads, tokens, dv) matching q's first three dims {tuple(q.shape[:3])},"
            f" got {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    b, h, n, d = q.shape
    if n < 1 or d < 1:
        raise ValueError(f"q must have at least one token and one feature, got {tuple(q.shape)}")
    return b, h, n, d, v.shape[-1]


def check_key_padding_mask(
    mask: torch.Tensor | None, b: int, n: int, device: torch.device
) -> torch.Tensor | None:
    """Validate a key padding mask: bool (b, n), True = real token, at least one real token per row.

    Returns ``None`` when the mask is ``None`` or all True (so callers can take the unmasked fast path).
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"key_padding_mask must be a bool tensor of shape ({b}, {n}), got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask must have dtype torch.bool (True = real token), got {mask.dtype};"
            " convert an HF-style 0/1 attention_mask with `mask.bool()`"
        )
    if tuple(mask.shape) != (b, n):
        raise ValueError(
            f"key_padding_mask must have shape (batch, tokens) = ({b}, {n}), got {tuple(mask.shape)}"
        )
    if mask.device != torch.device(device) and not (mask.device.type == torch.device(device).type):
        raise ValueError(f"key_padding_mask is on {mask.device} but the inputs are on {device}")
    real = mask.sum(-1)
    if bool((real == 0).any()):
        rows = torch.nonzero(real == 0).flatten().tolist()
        raise ValueError(
            f"key_padding_mask rows {rows} have no real token (all False); every sample needs one"
        )
    if bool(real.eq(n).all()):
        return None
    return mask


def check_finite(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf values")


def resolve_scale(scale: object, d: int) -> float:
    """The score scale as a positive finite float; None means ``1/sqrt(d)``."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if (
        not isinstance(scale, (int, float))
        or isinstance(scale, bool)
        or not math.isfinite(scale)
        or scale <= 0
    ):
        raise ValueError(f"scale must be a positive finite float or None (= 1/sqrt(head_dim)), got {scale!r}")
    return float(scale)
