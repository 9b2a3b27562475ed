"""The conv skip's plain reference: PyTorch's depthwise ``conv2d``.

Legend: b batch, h heads, n tokens, d head dim, K kernel length (odd).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference_conv_skip(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``Conv2d(h, h, (K, 1), padding=(K // 2, 0), groups=h, bias=False)`` of v (b, h, n, d) with
    ``weight`` (h, 1, K, 1), in v's dtype: (b, h, n, d)."""
    h, k = weight.shape[0], weight.shape[2]
    return F.conv2d(v, weight.to(v.dtype), padding=(k // 2, 0), groups=h)
