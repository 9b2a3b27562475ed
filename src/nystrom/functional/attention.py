"""Nyström and exact softmax attention as pure functions.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim.

The Nyström approximation (Xiong et al. 2021):  out = F · A⁺ · (B · V)  with
F = softmax(Q K̃ᵀ s) (n, m), A = softmax(Q̃ K̃ᵀ s) (m, m), B = softmax(Q̃ Kᵀ s) (m, n), Q̃, K̃ the
segment-means landmarks and s = 1/√d. The fused path never holds an (n, m) or (m, n) matrix:
B·V is flash attention of m landmark queries over the n keys, and F·(A⁺BV) is a chunked attention of
the n queries over the m landmarks. Invalid landmarks (a sample with fewer real tokens than m) are
removed exactly: their columns of F and B·V are masked and A is completed by an identity block, whose
pseudo-inverse is the identity block again, so they contribute nothing.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from nystrom.functional.attention_accel import nystrom_core
from nystrom.functional.kernels import long_key_attention, short_key_attention
from nystrom.functional.landmarks import SEGMENTS, _segment_means
from nystrom.ops.pinv import PINV_INITS, exact_pinv, iterative_pinv
from nystrom.utils.amp import autocast_off
from nystrom.utils.checks import (
    check_choice,
    check_finite,
    check_mask,
    check_positive_int,
    check_qkv,
    first_order_only,
    rejects_key_padding_mask,
    resolve_scale,
    value_checks_enabled,
    zero_padding,
)
from nystrom.utils.device import accelerator_path
from nystrom.utils.parallel import single_threaded

PINV_METHODS = ("iterative", "exact")

_CAUSAL_ERROR = (
    "causal=True is not supported: segment-means landmarks average over the whole sequence, so every "
    "output would see future tokens. Nyström attention is bidirectional; use softmax attention (or "
    "another causal method) for autoregressive models."
)


def _prepare(q, k, v, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale, causal):
    if causal:
        raise ValueError(_CAUSAL_ERROR)
    b, h, n, d, _ = check_qkv(q, k, v)
    check_positive_int("num_landmarks", num_landmarks)
    check_positive_int("pinv_iterations", pinv_iterations, minimum=0)
    check_choice("pinv", pinv, PINV_METHODS)
    check_choice("pinv_init", pinv_init, PINV_INITS)
    check_choice("segments", segments, SEGMENTS)
    mask = check_mask(mask, b, n, q.device)
    return mask, resolve_scale(scale, d)


def _sdpa(q, k, v, key_mask, scale):
    """softmax(q kᵀ·scale) v with ``key_mask`` (b, n_k) False keys excluded: the traceable path."""
    attn_mask = None if key_mask is None else key_mask[:, None, None, :]  # (b, 1, 1, n_k)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)


def _use_fused_kernels() -> bool:
    """Whether to run the fused CPU kernels (threads, custom autograd): not while torch.compile or
    torch.export trace, which cannot follow them; ``_sdpa`` computes the same function there."""
    return not torch.compiler.is_compiling()


def _landmark_kernel(q, k, m, mask, pinv_iterations, pinv, pinv_init, segments, scale):
    """Landmarks and A⁺, all in ≥ float32. Returns q̃, k̃ (b, h, m, d), A⁺ (b, h, m, m), valid (b, m)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    q_l, valid = _segment_means(q, m, mask, acc, segments)  # (b, h, m, d), (b, m)
    k_l, _ = _segment_means(k, m, mask, acc, segments)  # (b, h, m, d)
    # Landmarks are means of real tokens only, so this sees exactly the real positions (cheap: (m, d)).
    check_finite("q at a real (unpadded) token", q_l)
    check_finite("k at a real (unpadded) token", k_l)
    if _use_fused_kernels():  # a few small matrices only: one thread (no guard on b, h under compile)
        threads = single_threaded(q_l.shape[0] * q_l.shape[1] * m**3 < 2**22)
    else:
        threads = contextlib.nullcontext()
    with threads:
        scores = q_l @ k_l.mT * scale  # (b, h, m, m)
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        a = torch.softmax(scores, -1)  # (b, h, m, m)
        pair = valid[:, None, :, None] & valid[:, None, None, :]  # (b, 1, m, m)
        a = torch.where(pair, a, torch.eye(m, dtype=a.dtype, device=a.device))  # identity block on invalid
        z = iterative_pinv(a, pinv_iterations, pinv_init) if pinv == "iterative" else exact_pinv(a)
    return q_l, k_l, z, valid


@rejects_key_padding_mask
def nystrom_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_landmarks: int = 64,
    mask: torch.Tensor | None = None,
    pinv_iterations: int = 6,
    pinv: str = "iterative",
    pinv_init: str = "per_matrix",
    segments: str = "balanced",
    scale: float | None = None,
    causal: bool = False,
    padded_finite: bool = False,
) -> torch.Tensor:
    """Nyström self-attention, O(n·d + m²) memory.

    Args:
        q, k: (b, h, n, d); v: (b, h, n, dv). float16/bfloat16/float32/float64, one dtype.
        num_landmarks: m. With m ≥ n (and ``pinv="exact"``) the result is exact softmax attention.
        mask: bool (b, n), True = real token. Padded tokens enter neither landmarks nor keys, and may
            hold any values (NaN and Inf included): no real output or gradient depends on them. Their
            own output rows are unspecified (finite).
        pinv_iterations: iterations of the Razavi et al. method.
        pinv: ``"iterative"`` (the paper) or ``"exact"`` (``torch.linalg.pinv``).
        pinv_init: ``"per_matrix"`` or ``"original"`` (batch-wide Z₀, for parity with public code only).
        segments: ``"balanced"`` (real token of rank r of L goes to landmark ⌊r·m/L⌋) or
            ``"front_padded"`` (lucidrains' layout: runs of ⌈n/m⌉ positions after virtual front padding).
        scale: score scale, default 1/√d.
        causal: must be False; Nyström landmarks are bidirectional (raises if True).
        padded_finite: the caller guarantees that padded positions of q, k, v hold finite values (the
            modules' projections of zeroed inputs do), so they need not be zeroed: a padded key's
            probability is an exact 0, and 0 times a finite value is 0 (saves three passes, or on a GPU
            four launches, per call).

    Returns:
        (b, h, n, dv) in the inputs' dtype. Landmarks, A and A⁺ are computed in ≥ float32.
    """
    mask, scale = _prepare(
        q, k, v, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale, causal
    )
    if not isinstance(padded_finite, bool):
        raise TypeError(f"padded_finite must be a bool, got {padded_finite!r}")
    if not padded_finite:
        q, k, v = zero_padding(mask, q, k, v)
    dtype = q.dtype
    fused = _use_fused_kernels()
    if fused and accelerator_path(q):  # few large launches instead of the CPU's blocked kernels
        with autocast_off(q.device.type):
            out = nystrom_core(
                q, k, v, num_landmarks=num_landmarks, mask=mask, pinv_iterations=pinv_iterations, pinv=pinv,
                pinv_init=pinv_init, segments=segments, scale=scale,
            )  # fmt: skip
        return first_order_only(out, "nystrom_attention")
    with autocast_off(q.device.type):  # dtypes below are chosen on purpose
        q_l, k_l, z, valid = _landmark_kernel(
            q, k, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale
        )
        if fused:
            bv = long_key_attention(q_l.to(dtype), k, v, key_mask=mask, scale=scale)  # (b, h, m, dv)  B·V
        else:
            bv = _sdpa(q_l.to(dtype), k, v, mask, scale)  # (b, h, m, dv)  B·V
        check_finite("v at a real (unpadded) token", bv)
        w = (z @ bv.to(z.dtype)).to(dtype)  # (b, h, m, dv)  A⁺·(B·V)
        if not fused:
            return _sdpa(q, k_l.to(dtype), w, valid, scale)  # (b, h, n, dv)
        all_valid = value_checks_enabled(valid) and bool(valid.all())
        lvalid = None if all_valid else valid  # (b, m) only when a sample has < m real tokens
        out = short_key_attention(q, k_l.to(dtype), w, valid=lvalid, scale=scale)  # (b, h, n, dv)
    return first_order_only(out, "nystrom_attention")


@rejects_key_padding_mask
def nystrom_factors(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    num_landmarks: int = 64,
    mask: torch.Tensor | None = None,
    pinv_iterations: int = 6,
    pinv: str = "iterative",
    pinv_init: str = "per_matrix",
    segments: str = "balanced",
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three materialised factors, for plots, debugging and oracles: F (b,h,n,m), A⁺ (b,h,m,m), B (b,h,m,n).

    ``F @ A⁺ @ B`` is the (n, n) Nyström approximation of softmax(QKᵀs). Computed in ≥ float32.
    Options as in :func:`nystrom_attention`.
    """
    mask, scale = _prepare(
        q, k, k, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale, False
    )
    q, k = zero_padding(mask, q, k)
    q_l, k_l, z, valid = _landmark_kernel(
        q, k, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale
    )
    qf, kf = q.to(z.dtype), k.to(z.dtype)
    f = torch.softmax(
        (qf @ k_l.mT * scale).masked_fill(~valid[:, None, None, :], float("-inf")), -1
    )  # (b,h,n,m)
    s_b = q_l @ kf.mT * scale  # (b, h, m, n)
    if mask is not None:
        s_b = s_b.masked_fill(~mask[:, None, None, :], float("-inf"))
    return f, z, torch.softmax(s_b, -1)  # B (b, h, m, n)


@rejects_key_padding_mask
def nystrom_attention_materialized(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_landmarks: int = 64,
    mask: torch.Tensor | None = None,
    pinv_iterations: int = 6,
    pinv: str = "iterative",
    pinv_init: str = "per_matrix",
    segments: str = "balanced",
    scale: float | None = None,
) -> torch.Tensor:
    """The readable O(n·m) path: F · (A⁺ · (B · V)) with every factor materialised. (b, h, n, dv)."""
    f, z, bmat = nystrom_factors(
        q,
        k,
        num_landmarks=num_landmarks,
        mask=mask,
        pinv_iterations=pinv_iterations,
        pinv=pinv,
        pinv_init=pinv_init,
        segments=segments,
        scale=scale,
    )
    (vf,) = zero_padding(mask, v.to(z.dtype))
    return (f @ (z @ (bmat @ vf))).to(v.dtype)  # (b, h, n, dv)


@rejects_key_padding_mask
def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact softmax attention (fused SDPA): q, k (b, h, n, d), v (b, h, n, dv) -> (b, h, n, dv).

    ``mask`` (b, n) bool, True = real token; padded positions may hold any values (NaN, Inf).
    """
    b, h, n, d, _ = check_qkv(q, k, v)
    mask = check_mask(mask, b, n, q.device)
    q, k, v = zero_padding(mask, q, k, v)
    return _sdpa(q, k, v, mask, resolve_scale(scale, d))
