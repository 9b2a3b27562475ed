"""Nyström attention as an op: ``naive`` (the plain reference: factors materialised; a leaf only the tests
import), ``landmarks`` (segment means that respect padding, and the landmark kernel's A⁺), ``factors``
(F, A⁺ and B materialised, for inspection), the implementations ``cpu`` (with ``cpu_kernels`` and
``cpu_kernels_backward``), ``accelerator`` and ``traceable``, and ``dispatch`` (``nystrom_attention``:
the checks and the one choice between them)."""

from nystrom.ops.nystrom.cpu_kernels import long_key_attention, short_key_attention
from nystrom.ops.nystrom.dispatch import nystrom_attention
from nystrom.ops.nystrom.factors import nystrom_factors
from nystrom.ops.nystrom.landmarks import landmark_assignment, segment_means
from nystrom.ops.nystrom.options import PINV_METHODS

__all__ = [
    "PINV_METHODS",
    "landmark_assignment",
    "long_key_attention",
    "nystrom_attention",
    "nystrom_factors",
    "segment_means",
    "short_key_attention",
]
