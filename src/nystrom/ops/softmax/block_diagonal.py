"""Block-diagonal exact softmax attention: every token attends to the tokens of its own block only.

Legend: b batch, h heads, n tokens, c blocks (⌈n / w⌉), w block size, d head dim, dv value dim.

Tokens [iw, (i + 1)w) form block i. Running a model at n = c·w tokens with this attention (and copied
positions) computes exactly what it computes on the c blocks fed one by one: the control that separates
what full attention over a long input changes from what the long input itself changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nystrom.utils.checks import check_mask, check_positive_int, check_qkv, resolve_scale, zero_padding


def block_diagonal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block_size: int,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ s) v within blocks of ``block_size`` tokens: q, k (b, h, n, d), v (b, h, n, dv) ->
    (b, h, n, dv). The last block may be shorter (the inputs are padded up to c·w and the padding masked).

    ``mask`` (b, n) bool, True = real token; padded positions may hold any values (NaN, Inf). A block with no
    real token attends to its own zeroed keys (output 0 at padded queries, never NaN).
    """
    b, h, n, d, _ = check_qkv(q, k, v)
    check_positive_int("block_size", block_size)
    mask = check_mask(mask, b, n, q.device)
    q, k, v = zero_padding(mask, q, k, v)
    w = min(block_size, n)
    c = -(-n // w)
    extra = c * w - n
    if extra:  # pad the last block up to w; the padded keys are masked below
        q, k, v = (F.pad(t, (0, 0, 0, extra)) for t in (q, k, v))
        real = torch.ones(b, n, dtype=torch.bool, device=q.device) if mask is None else mask
        mask = F.pad(real, (0, extra), value=False)  # (b, c·w)
    split = lambda t: t.unflatten(2, (c, w))  # noqa: E731  (b, h, c, w, ·)
    attn_mask = None
    if mask is not None:
        keys = mask.view(b, c, w)  # (b, c, w)
        keys = keys | ~keys.any(-1, keepdim=True)  # an all-padding block sees its zeroed keys, not nothing
        attn_mask = keys[:, None, :, None, :]  # (b, 1, c, 1, w)
    out = F.scaled_dot_product_attention(
        split(q), split(k), split(v), attn_mask=attn_mask, scale=resolve_scale(scale, d)
    )  # (b, h, c, w, dv)
    return out.flatten(2, 3)[:, :, :n]  # (b, h, n, dv)
