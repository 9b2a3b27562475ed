"""Pure tensor maths: landmarks, pseudo-inverse, attention formulas. Shapes: b, h, n, m, d (see modules)."""

from nystrom.functional.attention import (
    PINV_METHODS,
    nystrom_attention,
    nystrom_attention_materialized,
    nystrom_factors,
    softmax_attention,
)
from nystrom.functional.kernels import long_key_attention, short_key_attention
from nystrom.functional.landmarks import landmark_assignment, segment_means
from nystrom.ops.pinv import PINV_INITS, exact_pinv, iterative_pinv

__all__ = [
    "PINV_INITS",
    "PINV_METHODS",
    "exact_pinv",
    "iterative_pinv",
    "landmark_assignment",
    "long_key_attention",
    "nystrom_attention",
    "nystrom_attention_materialized",
    "nystrom_factors",
    "segment_means",
    "short_key_attention",
    "softmax_attention",
]
