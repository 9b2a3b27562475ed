"""Nyström attention as an op: ``naive`` (the plain reference: factors materialised), ``landmarks``
(segment means that respect padding), the implementations ``cpu`` (with ``cpu_kernels`` and
``cpu_kernels_backward``), ``accelerator`` and ``traceable``, and ``dispatch`` (``nystrom_attention``:
the checks and the one choice between them)."""

from nystrom.ops.nystrom.cpu_kernels import long_key_attention, short_key_attention
from nystrom.ops.nystrom.dispatch import nystrom_attention
from nystrom.ops.nystrom.landmarks import landmark_assignment, segment_means
from nystrom.ops.nystrom.naive import nystrom_attention_materialized, nystrom_factors
from nystrom.ops.nystrom.options import PINV_METHODS

__all__ = [
    "PINV_METHODS",
    "landmark_assignment",
    "long_key_attention",
    "nystrom_attention",
    "nystrom_attention_materialized",
    "nystrom_factors",
    "segment_means",
    "short_key_attention",
]
