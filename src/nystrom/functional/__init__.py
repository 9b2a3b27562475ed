"""The functional API, a public path over :mod:`nystrom.ops`: Nyström attention, its factors,
landmarks, the pseudo-inverse, the two CPU softmax kernels and exact softmax attention.
Shapes: b, h, n, m, d (see the op modules)."""

from nystrom.ops.nystrom import (
    PINV_METHODS,
    landmark_assignment,
    long_key_attention,
    nystrom_attention,
    nystrom_factors,
    segment_means,
    short_key_attention,
)
from nystrom.ops.pinv import PINV_INITS, exact_pinv, iterative_pinv
from nystrom.ops.softmax import softmax_attention

__all__ = [
    "PINV_INITS",
    "PINV_METHODS",
    "exact_pinv",
    "iterative_pinv",
    "landmark_assignment",
    "long_key_attention",
    "nystrom_attention",
    "nystrom_factors",
    "segment_means",
    "short_key_attention",
    "softmax_attention",
]
