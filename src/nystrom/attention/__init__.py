"""Attention modules behind one interface (:class:`AttentionBase`) and a plain dict registry.

``REGISTRY[name](dim, *, heads, dim_head, <variant options>)`` builds a module whose
``forward(x (b, n, dim), mask=None (b, n) bool)`` returns (b, n, dim).
"""

from nystrom.attention.base import AttentionBase
from nystrom.attention.linear import LinearAttention
from nystrom.attention.linformer import LinformerAttention
from nystrom.attention.longformer import LongformerAttention
from nystrom.attention.nystrom import NystromAttention
from nystrom.attention.performer import PerformerAttention
from nystrom.attention.reformer import ReformerAttention
from nystrom.attention.softmax import SoftmaxAttention

REGISTRY: dict[str, type[AttentionBase]] = {
    "nystrom": NystromAttention,
    "softmax": SoftmaxAttention,
    "linformer": LinformerAttention,
    "linear": LinearAttention,
    "longformer": LongformerAttention,
    "performer": PerformerAttention,
    "reformer": ReformerAttention,
}

__all__ = [
    "REGISTRY",
    "AttentionBase",
    "LinearAttention",
    "LinformerAttention",
    "LongformerAttention",
    "NystromAttention",
    "PerformerAttention",
    "ReformerAttention",
    "SoftmaxAttention",
]
