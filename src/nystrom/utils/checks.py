"""Input validation shared by the functional API and the modules.

Every check raises ``ValueError``/``TypeError`` that names the argument and the expected form:
a wrong shape must never turn into a silent broadcast or a wrong answer.
Legend: b batch, h heads, n tokens, d head dim.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

from nystrom.utils.amp import autocast_enabled

P = ParamSpec("P")
R = TypeVar("R")

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise naming the option."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool; a ``TypeError`` naming ``name`` otherwise (1 and "yes" are not bools)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
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


MASK_CONVENTION = (
    "mask is a bool (batch, tokens) tensor with True = real token (as transformers' attention_mask and"
    " lucidrains' mask)"
)


def rejects_key_padding_mask(fn: Callable[P, R]) -> Callable[P, R]:
    """Make ``fn(..., key_padding_mask=...)`` raise a ``TypeError`` that states the mask convention.

    Why not just let Python reject the unknown keyword: the old name (and PyTorch's
    ``nn.MultiheadAttention(key_padding_mask=...)``, where True means *padding*) invites passing an
    inverted mask, which would give a silently wrong answer; the error says which way round ours is.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if "key_padding_mask" in kwargs:
            raise TypeError(
                f"{fn.__qualname__}() takes no key_padding_mask: pass mask= instead. {MASK_CONVENTION}."
                " PyTorch's nn.MultiheadAttention(key_padding_mask=...) uses the opposite convention"
                " (True = padding): convert such a mask with mask=~key_padding_mask."
            )
        return fn(*args, **kwargs)

    return wrapper


def value_checks_enabled(t: torch.Tensor) -> bool:
    """Whether checks that read tensor *values* on the host (NaN/Inf, empty mask rows) run for ``t``.

    They run eagerly on CPU, where reading a value costs no device synchronisation. They are skipped
    under ``torch.compile``/``torch.export`` (traced tensors hold no values) and on the meta device, and
    on accelerators (each read would stall the host on the device queue on every call) unless anomaly
    detection is on (``torch.autograd.set_detect_anomaly(True)``, PyTorch's own slow debugging switch).
    """
    if torch.compiler.is_compiling() or t.device.type == "meta":
        return False
    return t.device.type == "cpu" or torch.is_anomaly_enabled()


def check_mask(mask: torch.Tensor | None, b: int, n: int, device: torch.device) -> torch.Tensor | None:
    """Validate a padding mask: bool (b, n), True = real token, at least one real token per row.

    Returns ``None`` when the mask is ``None``, or when it is all True and value checks run (see
    :func:`value_checks_enabled`), so callers can take the unmasked fast path; otherwise the mask.
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a bool tensor of shape ({b}, {n}), got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must have dtype torch.bool (True = real token), got {mask.dtype};"
            " convert an HF-style 0/1 attention_mask with `mask.bool()`"
        )
    if tuple(mask.shape) != (b, n):
        raise ValueError(f"mask must have shape (batch, tokens) = ({b}, {n}), got {tuple(mask.shape)}")
    if mask.device.type != torch.device(device).type:
        raise ValueError(f"mask is on {mask.device} but the inputs are on {device}")
    if not value_checks_enabled(mask):
        return mask  # the masked path is exact for an all-True mask too
    real = mask.sum(-1)
    if bool((real == 0).any()):
        rows = torch.nonzero(real == 0).flatten().tolist()
        raise ValueError(f"mask rows {rows} have no real token (all False); every sample needs one")
    if bool(real.eq(n).all()):
        return None
    return mask


def check_scale(scale: float | None) -> float | None:
    """A module's logit scale: None (1/√d) or a finite number > 0; returned as a float."""
    if scale is None:
        return None
    if (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not math.isfinite(scale)
        or scale <= 0
    ):
        raise ValueError(f"scale must be None (1/sqrt(d)) or a finite number > 0, got {scale!r}")
    return float(scale)


def zero_padding(
    mask: torch.Tensor | None, *ts: torch.Tensor, padded_finite: bool = False
) -> tuple[torch.Tensor, ...]:
    """Each (b, h, n, ·) tensor with its padded positions (``mask`` (b, n) False) set to 0.

    Why: padded positions may hold anything, NaN and Inf included; a masked-out probability of 0 times
    NaN is still NaN, so the values themselves are replaced (``masked_fill``, whose gradient there is 0).
    ``padded_finite``: the caller guarantees finite padded values (the modules' projections of zeroed
    inputs), and 0 times a finite value is 0: the tensors are returned as they are (no fills, which on a
    GPU are launches, forward and backward).
    """
    if mask is None or check_bool("padded_finite", padded_finite):
        return ts
    pad = ~mask[:, None, :, None]  # (b, 1, n, 1)
    return tuple(t.masked_fill(pad, 0) for t in ts)


def check_finite(name: str, t: torch.Tensor) -> None:
    """Raise if ``t`` holds NaN or Inf (only where :func:`value_checks_enabled`)."""
    if value_checks_enabled(t) and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf values")


def check_dtype_matches(x: torch.Tensor, weight: torch.Tensor) -> None:
    """Raise a ``TypeError`` naming both dtypes if ``x`` and a module's ``weight`` differ outside autocast."""
    if x.dtype != weight.dtype and not autocast_enabled(x.device.type):
        raise TypeError(
            f"x has dtype {x.dtype} but the module's parameters are {weight.dtype}: convert one to the"
            f" other, e.g. x.to({weight.dtype}) or module.to({x.dtype}), or run under torch.autocast"
        )


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


class _FirstOrderOnly(torch.autograd.Function):
    """Identity whose backward refuses ``create_graph=True`` with a clear message (see first_order_only)."""

    @staticmethod
    def forward(ctx, x, what):
        ctx.what = what
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # autograd enables grad mode in a backward exactly when create_graph=True
            raise NotImplementedError(
                f"double backward (create_graph=True) through {ctx.what} is not implemented: its kernels"
                " recompute in the backward instead of keeping a differentiable graph. For higher-order"
                " gradients compose nystrom.functional.nystrom_factors: f, z, b = nystrom_factors(q, k, ...), then"
                " f @ (z @ (b @ v)) (plain PyTorch ops)."
            )
        return grad, None


def first_order_only(x: torch.Tensor, what: str) -> torch.Tensor:
    """``x`` unchanged; a backward through it with ``create_graph=True`` raises ``NotImplementedError``.

    Without it a double backward fails deep inside with PyTorch's "trying to differentiate twice a
    function that was marked with @once_differentiable" or "derivative for aten::…_backward is not
    implemented". Skipped when nothing needs a gradient, and when traced (the compiler rejects double
    backward itself).
    """
    if torch.compiler.is_compiling() or not (torch.is_grad_enabled() and x.requires_grad):
        return x
    return _FirstOrderOnly.apply(x, what)
