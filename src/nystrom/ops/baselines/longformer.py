"""Longformer sliding-window attention (Beltagy et al. 2020), chunked to O(n·w) memory.

Legend: b batch, h heads, n tokens, d head dim, dv value dim, w window size (odd, ``2r + 1``),
r one-sided radius, c block size (>= r), nb number of blocks, t = 3c keys seen by one block.

Query i attends to keys j with ``|i - j| <= r`` (itself included). The sequence is padded to nb blocks of
c tokens; block z attends to blocks z-1, z, z+1 (t = 3c keys), which covers every window because c >= r.
Out-of-window, out-of-range and padded keys are masked inside those (c, 3c) score tiles, so no (n, n)
tensor (scores or mask) is ever built. Global tokens are not implemented.

Padding is exact: a padded key gets zero weight from every query that has a real key in its window, so
a row padded at its end equals the same row run at its real length. A query whose window holds no real
key (a padded query far from any real token) gets a finite, meaningless output instead of NaN.
"""

from __future__ import annotations

import torch

from nystrom.utils.checks import (
    check_mask,
    check_positive_int,
    check_qkv,
    rejects_key_padding_mask,
    resolve_scale,
    zero_padding,
)

#: smallest block size: tiny windows would otherwise mean thousands of tiny matmuls
_MIN_BLOCK = 16


def block_size(window_size: int) -> int:
    """c, the tokens per block for ``window_size`` = 2r + 1: r, or :data:`_MIN_BLOCK` for small windows."""
    return max(window_size // 2, _MIN_BLOCK)


def _neighbour_blocks(x: torch.Tensor) -> torch.Tensor:
    """(..., nb + 2, c, *rest) blocks padded by one on each side -> (..., nb, 3c, *rest) for z-1, z, z+1."""
    return torch.cat((x[..., :-2, :, :], x[..., 1:-1, :, :], x[..., 2:, :, :]), dim=-2)


@rejects_key_padding_mask
def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    window_size: int = 257,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Local attention: each query sees the ``window_size`` keys centred on it.

    Args:
        q, k: (b, h, n, d); v: (b, h, n, dv).
        window_size: odd w = 2r + 1 (257 = 128 each side + self, the Nyströmformer paper's setting).
        mask: (b, n) bool, True = real token, or None.
        scale: logit scale, default ``1/sqrt(d)``.

    Returns:
        (b, h, n, dv).
    """
    b, _, n, d, _ = check_qkv(q, k, v)
    check_positive_int("window_size", window_size)
    if window_size % 2 == 0:
        raise ValueError(f"window_size must be odd (2 * radius + 1, centred on the query), got {window_size}")
    mask = check_mask(mask, b, n, q.device)
    q, k, v = zero_padding(mask, q, k, v)  # padded positions may hold NaN/Inf
    scale = resolve_scale(scale, d)
    r = window_size // 2
    c = block_size(window_size)
    nb = (n + c - 1) // c  # not -(-n // c): torch.onnx writes // as Div, which truncates negatives
    pad = nb * c - n

    def blocks(x: torch.Tensor) -> torch.Tensor:
        # one zero block before, zeros to a block multiple plus one block after
        x = torch.nn.functional.pad(x, (0, 0, c, pad + c))  # (b, h, (nb + 2) c, d)
        return x.unflatten(2, (nb + 2, c))  # (b, h, nb + 2, c, d)

    padded = pad or torch.compiler.is_compiling()  # traced: pad always (a branch on n would fix the length)
    q_b = (torch.nn.functional.pad(q, (0, 0, 0, pad)) if padded else q).unflatten(2, (nb, c))  # (b, h, nb, c, d)
    k_w = _neighbour_blocks(blocks(k))  # (b, h, nb, t, d)
    v_w = _neighbour_blocks(blocks(v))  # (b, h, nb, t, dv)

    # key validity in padded coordinates: inside [0, n) and real
    # (no slice assignment: under torch.cond, as the ONNX export traces the unpadded branch, it broke
    # torch.onnx's decomposition with "Attempting to use FunctionalTensor on its own")
    pos = torch.arange((nb + 2) * c, device=q.device)  # padded coordinates
    valid = ((pos >= c) & (pos < c + n))[None]  # (1, (nb + 2) c): one row serves every batch row
    if mask is not None:
        valid = valid & torch.nn.functional.pad(mask, (c, pad + c))  # (b, (nb + 2) c)
    valid = valid.unflatten(1, (nb + 2, c)).unsqueeze(-1)  # (b or 1, nb + 2, c, 1)
    valid = _neighbour_blocks(valid).squeeze(-1)  # (b or 1, nb, t)
    pos_q = torch.arange(c, device=q.device)[:, None]  # (c, 1) query offset in its block
    pos_k = torch.arange(3 * c, device=q.device)[None, :] - c  # (1, t) key offset from the block start
    band = (pos_k - pos_q).abs() <= r  # (c, t)
    allowed = band & valid[:, :, None, :]  # (b or 1, nb, c, t)

    scores = (q_b * scale) @ k_w.mT  # (b, h, nb, c, t); scaling q is t/d times cheaper than the scores
    # finite fill: a row with no allowed key becomes uniform instead of NaN; in place saves one copy
    scores.masked_fill_(~allowed[:, None], torch.finfo(scores.dtype).min)
    attn = torch.softmax(scores, dim=-1)  # (b, h, nb, c, t)
    del scores  # backward needs only attn: free the logits before the value matmul (peak memory)
    out = attn @ v_w  # (b, h, nb, c, dv)
    return out.flatten(2, 3)[:, :, :n]  # (b, h, n, dv)
