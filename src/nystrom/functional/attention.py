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

import math

import torch
import torch.nn.functional as F

from nystrom.functional.checks import (
    check_choice,
    check_key_padding_mask,
    check_positive_int,
    check_qkv,
    resolve_scale,
)
from nystrom.functional.kernels import long_key_attention, short_key_attention
from nystrom.functional.landmarks import _segment_means
from nystrom.functional.parallel import single_threaded
from nystrom.functional.pinv import PINV_INITS, exact_pinv, iterative_pinv

PINV_METHODS = ("iterative", "exact")

_CAUSAL_ERROR = (
    "causal=True is not supported: segment-means landmarks average over the whole sequence, so every "
    "output would see future tokens. Nyström attention is bidirectional; use softmax attention (or "
    "another causal method) for autoregressive models."
)


def _prepare(q, k, v, num_landmarks, key_padding_mask, pinv_iterations, pinv, pinv_init, scale, causal):
    if causal:
        raise ValueError(_CAUSAL_ERROR)
    b, h, n, d, _ = check_qkv(q, k, v)
    check_positive_int("num_landmarks", num_landmarks)
    check_positive_int("pinv_iterations", pinv_iterations, minimum=0)
    check_choice("pinv", pinv, PINV_METHODS)
    check_choice("pinv_init", pinv_init, PINV_INITS)
    mask = check_key_padding_mask(key_padding_mask, b, n, q.device)
    return mask, resolve_scale(scale, d)


def _landmark_kernel(q, k, m, mask, pinv_iterations, pinv, pinv_init, scale):
    """Landmarks and A⁺, all in ≥ float32. Returns q̃, k̃ (b, h, m, d), A⁺ (b, h, m, m), valid (b, m)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    q_l, valid = _segment_means(q, m, mask, acc)  # (b, h, m, d), (b, m)
    k_l, _ = _segment_means(k, m, mask, acc)  # (b, h, m, d)
    if not bool(torch.isfinite(q_l).all() and torch.isfinite(k_l).all()):
        raise ValueError("q or k contains NaN or Inf at a real (unpadded) token")
    with single_threaded(q_l.shape[0] * q_l.shape[1] * m**3 < 2**22):  # a few small matrices only
        scores = q_l @ k_l.mT * scale  # (b, h, m, m)
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        a = torch.softmax(scores, -1)  # (b, h, m, m)
        pair = valid[:, None, :, None] & valid[:, None, None, :]  # (b, 1, m, m)
        a = torch.where(pair, a, torch.eye(m, dtype=a.dtype, device=a.device))  # identity block on invalid
        z = iterative_pinv(a, pinv_iterations, pinv_init) if pinv == "iterative" else exact_pinv(a)
    return q_l, k_l, z, valid


def nystrom_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_landmarks: int = 64,
    key_padding_mask: torch.Tensor | None = None,
    pinv_iterations: int = 6,
    pinv: str = "iterative",
    pinv_init: str = "per_matrix",
    scale: float | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Nyström self-attention, O(n·d + m²) memory.

    Args:
        q, k: (b, h, n, d); v: (b, h, n, dv). float16/bfloat16/float32/float64, one dtype.
        num_landmarks: m. With m ≥ n (and ``pinv="exact"``) the result is exact softmax attention.
        key_padding_mask: bool (b, n), True = real token. Padded tokens enter neither landmarks nor
            keys; their own output rows are unspecified (finite). Padded positions may hold any finite values.
        pinv_iterations: iterations of the Razavi et al. method.
        pinv: ``"iterative"`` (the paper) or ``"exact"`` (``torch.linalg.pinv``).
        pinv_init: ``"per_matrix"`` or ``"original"`` (batch-wide Z₀, for parity with public code only).
        scale: score scale, default 1/√d.
        causal: must be False; Nyström landmarks are bidirectional (raises if True).

    Returns:
        (b, h, n, dv) in the inputs' dtype. Landmarks, A and A⁺ are computed in ≥ float32.
    """
    mask, scale = _prepare(
        q, k, v, num_landmarks, key_padding_mask, pinv_iterations, pinv, pinv_init, scale, causal
    )
    dtype = q.dtype
    with torch.autocast(q.device.type, enabled=False):  # dtypes below are chosen on purpose
        q_l, k_l, z, valid = _landmark_kernel(
            q, k, num_landmarks, mask, pinv_iterations, pinv, pinv_init, scale
        )
        bv = long_key_attention(q_l.to(dtype), k, v, key_mask=mask, scale=scale)  # (b, h, m, dv)  B·V
        if not bool(torch.isfinite(bv).all()):
            raise ValueError("v contains NaN or Inf at a real (unpadded) token")
        w = (z @ bv.to(z.dtype)).to(dtype)  # (b, h, m, dv)  A⁺·(B·V)
        lvalid = None if bool(valid.all()) else valid  # (b, m) only when a sample has < m real tokens
        return short_key_attention(q, k_l.to(dtype), w, valid=lvalid, scale=scale)  # (b, h, n, dv)


def nystrom_factors(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    num_landmarks: int = 64,
    key_padding_mask: torch.Tensor | None = None,
    pinv_iterations: int = 6,
    pinv: str = "iterative",
    pinv_init: str = "per_matrix",
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three materialised factors, for plots, debugging and oracles: F (b,h,n,m), A⁺ (b,h,m,m), B (b,h,m,n).

    ``F @ A⁺ @ B`` is the (n, n) Nyström approximation of softmax(QKᵀs). Computed in ≥ float32.
    """
    mask, scale = _prepare(
        q, k, k, num_landmarks, key_padding_mask, pinv_iterations, pinv, pinv_init, scale, False
    )
    q_l, k_l, z, valid = _landmark_kernel(q, k, num_landmarks, mask, pinv_iterations, pinv, pinv_init, scale)
    qf, kf = q.to(z.dtype), k.to(z.dtype)
    f = torch.softmax(
        (qf @ k_l.mT * scale).masked_fill(~valid[:, None, None, :], float("-inf")), -1
    )  # (b,h,n,m)
    s_b = q_l @ kf.mT * scale  # (b, h, m, n)
    if mask is not None:
        s_b = s_b.masked_fill(~mask[:, None, None, :], float("-inf"))
    return f, z, torch.softmax(s_b, -1)  # B (b, h, m, n)


def nystrom_attention_materialized(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_landmarks: int = 64,
    key_padding_mask: torch.Tensor | None = None,
    pinv_iterations: int = 6,
    pinv: str = "iterative",
    pinv_init: str = "per_matrix",
    scale: float | None = None,
) -> torch.Tensor:
    """The readable O(n·m) path: F · (A⁺ · (B · V)) with every factor materialised. (b, h, n, dv)."""
    f, z, bmat = nystrom_factors(
        q,
        k,
        num_landmarks=num_landmarks,
        key_padding_mask=key_padding_mask,
        pinv_iterations=pinv_iterations,
        pinv=pinv,
        pinv_init=pinv_init,
        scale=scale,
    )
    vf = v.to(z.dtype)
    if key_padding_mask is not None:
        vf = vf.masked_fill(~key_padding_mask[:, None, :, None], 0)
    return (f @ (z @ (bmat @ vf))).to(v.dtype)  # (b, h, n, dv)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact softmax attention (fused SDPA): q, k (b, h, n, d), v (b, h, n, dv) -> (b, h, n, dv)."""
    b, h, n, d, _ = check_qkv(q, k, v)
    mask = check_key_padding_mask(key_padding_mask, b, n, q.device)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    key_mask = None if mask is None else mask[:, None, None, :]
    if mask is not None:
        v = v.masked_fill(~key_mask.mT, 0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, scale=scale)
