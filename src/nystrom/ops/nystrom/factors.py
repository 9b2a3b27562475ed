"""Nyström attention's three factors, materialised: for plots, debugging, ``output_attentions`` and oracles.

Legend: b batch, h heads, n tokens, m landmarks, d head dim.

F = softmax(Q K̃ᵀ s) (n, m), A⁺ the pseudo-inverse of A = softmax(Q̃ K̃ᵀ s) (m, m) and B = softmax(Q̃ Kᵀ s)
(m, n), with the landmarks and A⁺ of :mod:`.landmarks` (the very code every path uses); invalid landmarks
(a sample with fewer real tokens than m) are masked out of F and B, and A⁺ holds an identity block there.
"""

from __future__ import annotations

import torch

from nystrom.ops.nystrom.landmarks import landmark_kernel_pinv, landmark_means
from nystrom.ops.nystrom.options import check_options
from nystrom.utils.checks import rejects_key_padding_mask, zero_padding


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
    s_f = qf @ k_l.mT * scale  # (b, h, n, m)
    if valid is not None:  # None: every landmark used (landmarks.every_landmark_used)
        s_f = s_f.masked_fill(~valid[:, None, None, :], float("-inf"))
    f = torch.softmax(s_f, -1)  # (b, h, n, m)
    s_b = q_l @ kf.mT * scale  # (b, h, m, n)
    if mask is not None:
        s_b = s_b.masked_fill(~mask[:, None, None, :], float("-inf"))
    return f, z, torch.softmax(s_b, -1)  # B (b, h, m, n)
