"""The Nyström core on the accelerator path: the same maths as the CPU path (:mod:`nystrom.ops.nystrom.cpu`),
as few (and large) ops as it allows.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim, s score scale.

Why a path of its own: on a GPU each op is a kernel launch of a few µs, and at MiniLM size (m = 64,
n = 4096) the launches, not the FLOPs, set the time. Per call:

* landmarks: one GEMM each for q̃ and k̃ with the averaging matrix W (b, m, n) of
  :func:`~nystrom.ops.nystrom.landmarks.averaging_weights` (any mask), the score scale folded into q̃'s W;
* A = softmax(q̃ k̃ᵀ s): one GEMM and a softmax (+ a fill and a select where landmarks can be empty);
* A⁺: the ``nystrom::iterative_pinv`` op (one launch forward);
* B·V and F·(A⁺BV): two SDPA calls with additive masks, and one GEMM between them.

Everything derived from the mask alone (W, the additive masks, the empty-landmark blocks) is computed once
per forward for all layers (:func:`~nystrom.ops.nystrom.landmarks.shared_plan`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nystrom.ops.nystrom.landmarks import averaging_weights
from nystrom.ops.pinv import exact_pinv, iterative_pinv
from nystrom.ops.plan import shared
from nystrom.utils.checks import check_finite


def _landmarks(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``w`` (b, m, n) times the rows of ``x`` (b, h, n, d) -> (b, h, m, d) in w's dtype, a head view of
    a (b, m, h, d) result.

    The (b, n, h·d) rows are a view for head views of a joint (b, n, 3, h, d) projection (the modules'
    q, k, v): one GEMM for every head. The result stays token-major: SDPA takes it as it is, and the
    batched (b·h) product of the scores views it without a copy when b = 1 (and copies it otherwise)."""
    b, h, n, d = x.shape
    rows = x.transpose(1, 2).reshape(b, n, h * d).to(w.dtype)  # (b, n, h·d)
    return torch.bmm(w, rows).view(b, -1, h, d).transpose(1, 2)  # (b, h, m, d)


def _additive(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (b, k) -> (b, 1, 1, k) SDPA mask of 0 (kept) and -inf: a float mask needs no conversion op."""
    bias = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))
    return bias[:, None, None]  # (b, 1, 1, k)


def _plan(mask, b, n, m, segments, scale, acc, device):
    """What the mask determines, once per forward: W·s and W (b, m, n), valid (b, m) or None."""
    w, valid = averaging_weights(mask, b, n, m, device, segments=segments, dtype=acc)
    w = w.contiguous()  # (b, m, n): batched GEMMs need a real batch stride
    return w * scale, w, valid


def _empty_blocks(valid: torch.Tensor, m: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """What makes A exact where landmarks are empty, as one select on the scores: ``pair`` (b, 1, m, m),
    True where both landmarks are used, and the scores elsewhere (b, 1, m, m): −inf, except 0 on the
    diagonal of an empty landmark's row. The softmax then gives the empty landmarks' columns 0 in every
    used row and their rows e_i: A completed by an identity block, whose pseudo-inverse is itself."""
    pair = valid[:, None, :, None] & valid[:, None, None, :]  # (b, 1, m, m)
    diagonal = torch.eye(m, dtype=torch.bool, device=valid.device)
    fill = torch.full(pair.shape, float("-inf"), dtype=dtype, device=valid.device)
    return pair, fill.masked_fill_(diagonal & ~pair, 0.0)


def nystrom_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_landmarks: int,
    mask: torch.Tensor | None,
    pinv_iterations: int,
    pinv: str,
    pinv_init: str,
    segments: str,
    scale: float,
) -> torch.Tensor:
    """``nystrom_attention`` on checked inputs with zeroed (or finite) padding: (b, h, n, dv) in q's dtype."""
    b, h, n, d = q.shape
    m, dtype = num_landmarks, q.dtype
    acc = torch.promote_types(dtype, torch.float32)
    key = ("accelerator", b, n, m, segments, scale, acc, q.device)
    ws, w, valid = shared(mask, key, lambda: _plan(mask, b, n, m, segments, scale, acc, q.device))
    q_l = _landmarks(ws, q)  # (b, h, m, d) q̃·s
    k_l = _landmarks(w, k)  # (b, h, m, d) k̃
    check_finite("q at a real (unpadded) token", q_l)
    check_finite("k at a real (unpadded) token", k_l)
    scores = q_l @ k_l.mT  # (b, h, m, m), already scaled
    if valid is not None:
        blocks = ("empty-blocks", b, m, acc, q.device)
        pair, fill = shared(mask, blocks, lambda: _empty_blocks(valid, m, acc))
        scores = torch.where(pair, scores, fill)
    a = torch.softmax(scores, -1)  # (b, h, m, m); an identity block on empty landmarks
    z = iterative_pinv(a, pinv_iterations, pinv_init) if pinv == "iterative" else exact_pinv(a)
    key_mask = None
    if mask is not None:
        key_mask = shared(mask, ("keys", dtype, q.device), lambda: _additive(mask, dtype))  # (b, 1, 1, n)
    bv = F.scaled_dot_product_attention(q_l.to(dtype), k, v, attn_mask=key_mask, scale=1.0)  # (b, h, m, dv)
    check_finite("v at a real (unpadded) token", bv)
    wv = (z @ bv.to(z.dtype)).to(dtype)  # (b, h, m, dv) A⁺·(B·V)
    lmask = None
    if valid is not None:
        lmask = shared(
            mask, ("landmarks", m, dtype, q.device), lambda: _additive(valid, dtype)
        )  # (b, 1, 1, m)
    return F.scaled_dot_product_attention(q, k_l.to(dtype), wv, attn_mask=lmask, scale=scale)  # (b, h, n, dv)
