"""The options of Nyström attention and their checks, shared by the entry point and the reference.

Legend: b batch, h heads, n tokens, d head dim.
"""

from __future__ import annotations

import torch

from nystrom.ops.nystrom.landmarks import SEGMENTS
from nystrom.ops.pinv import PINV_INITS
from nystrom.utils.checks import check_choice, check_mask, check_positive_int, check_qkv, resolve_scale

PINV_METHODS = ("iterative", "exact")

_CAUSAL_ERROR = (
    "causal=True is not supported: segment-means landmarks average over the whole sequence, so every "
    "output would see future tokens. Nyström attention is bidirectional; use softmax attention (or "
    "another causal method) for autoregressive models."
)


def check_options(
    q, k, v, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale, causal
) -> tuple[torch.Tensor | None, float]:
    """Check q, k (b, h, n, d), v and the options; return the checked mask (b, n) or None and the scale."""
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
