"""The plain reference of Nyström attention: every factor materialised, in ≥ float32 (O(n·m) memory).

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim.

The Nyström approximation (Xiong et al. 2021):  out = F · A⁺ · (B · V)  with
F = softmax(Q K̃ᵀ s) (n, m), A = softmax(Q̃ K̃ᵀ s) (m, m), B = softmax(Q̃ Kᵀ s) (m, n), Q̃, K̃ the
segment-means landmarks and s = 1/√d. Invalid landmarks (a sample with fewer real tokens than m) are
removed exactly: their columns of F and B·V are masked and A is completed by an identity block, whose
pseudo-inverse is the identity block again, so they contribute nothing.

The factors come from :mod:`.factors` (whose landmarks and A⁺ are the code every path runs); the paths
differ from this reference only in how they form the two large products B·V and F·(A⁺BV), which they
never materialise. A leaf: only the tests import it.
"""

from __future__ import annotations

import torch

from nystrom.ops.nystrom.factors import nystrom_factors
from nystrom.utils.checks import rejects_key_padding_mask, zero_padding


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
