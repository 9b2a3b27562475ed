"""Exact softmax attention: ``sdpa`` (full attention through PyTorch's SDPA kernel) and ``block_diagonal``
(every token attends to its own block of w tokens only). Neither has a device branch: SDPA picks its
kernel itself."""

from nystrom.ops.softmax.block_diagonal import block_diagonal_attention
from nystrom.ops.softmax.sdpa import masked_sdpa, softmax_attention

__all__ = ["block_diagonal_attention", "masked_sdpa", "softmax_attention"]
