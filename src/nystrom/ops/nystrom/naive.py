"""The plain reference of Nyström attention: every factor materialised, in ≥ float32 (O(n·m) memory).

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim.

The Nyström approximation (Xiong et al. 2021):  out = F · A⁺ · (B · V)  with
F = softmax(Q K̃ᵀ s) (n, m), A = softmax(Q̃ K̃ᵀ s) (m, m), B = softmax(Q̃ Kᵀ s) (m, n), Q̃, K̃ the
segment-means landmarks and s = 1/√d. Invalid landmarks (a sample with fewer real tokens than m) are
removed exactly: their columns of F and B·V are masked and A is completed by an identity block, whose
pseudo-inverse is the identity block again, so they contribute nothing.

The landmarks and A⁺ (:func:`landmark_means`, :func:`landmark_kernel_pinv`) are small, (m, d) and (m, m)
per head: the CPU and traceable paths compute them with this very code and differ from the reference
only in how they form the two large products B·V and F·(A⁺BV), which they never materialise.
"""

from __future__ import annotations

import torch

from nystrom.ops.nystrom.landmarks import _segment_means
from nystrom.ops.nystrom.options import check_options
from nystrom.ops.pinv import exact_pinv, iterative_pinv
from nystrom.utils.checks import check_finite, rejects_key_padding_mask, zero_padding


def landmark_means(q, k, m, mask, segments) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q̃, K̃ (b, h, m, d) in ≥ float32 and valid (b, m) from q, k (b, h, n, d) with zeroed padding."""
    acc = torch.promote_types(q.dtype, torch.float32)
    q_l, valid = _segment_means(q, m, mask, acc, segments)  # (b, h, m, d), (b, m)
    k_l, _ = _segment_means(k, m, mask, acc, segments)  # (b, h, m, d)
    # Landmarks are means of real tokens only, so this sees exactly the real positions (cheap: (m, d)).
    check_finite("q at a real (unpadded) token", q_l)
    check_finite("k at a real (unpadded) token", k_l)
    return q_l, k_l, valid


def landmark_kernel_pinv(q_l, k_l, valid, scale, pinv_iterations, pinv, pinv_init) -> torch.Tensor:
    """A⁺ (b, h, m, m) of A = softmax(Q̃ K̃ᵀ s), with an identity block on the invalid landmarks."""
    m = q_l.shape[-2]
    scores = q_l @ k_l.mT * scale  # (b, h, m, m)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    a = torch.softmax(scores, -1)  # (b, h, m, m)
    pair = valid[:, None, :, None] & valid[:, None, None, :]  # (b, 1, m, m)
    a = torch.where(pair, a, torch.eye(m, dtype=a.dtype, device=a.device))  # identity block on invalid
    return iterative_pinv(a, pinv_iterations, pinv_init) if pinv == "iterative" else exact_pinv(a)


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
    Options as in :func:`~nystrom.ops.nystrom.dispatch.nystrom_attention`.
    """
    mask, scale = check_options(
        q, k, k, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale, False
    )
    q, k = zero_padding(mask, q, k)
    q_l, k_l, valid = landmark_means(q, k, num_landmarks, mask, segments)
    z = landmark_kernel_pinv(q_l, k_l, valid, scale, pinv_iterations, pinv, pinv_init)
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
