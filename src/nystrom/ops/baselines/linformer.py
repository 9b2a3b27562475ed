"""Linformer attention (Wang et al. 2020): softmax attention over sequence-projected keys/values.

Legend: b batch, h heads, n tokens, d head dim, dv value dim, p projection length (Linformer's k),
N the maximum sequence length the projections were built for (``max_seq_len``).

``E, F`` of shape (p, N) project keys and values along the sequence: ``K' = E[:, :n] K`` and
``V' = F[:, :n] V`` are (p, d), so the attention matrix is (n, p) instead of (n, n).

Padding: padded keys and values are zeroed *before* the projection, so a padded token adds nothing to
``K'`` or ``V'`` whatever its content: the padded tokens' contribution is removed exactly. A row padded
at its end therefore equals the same row run unpadded at its real length (the zeroed columns are the
ones the shorter run drops). Padded positions still get an output (attending to real tokens only).
"""

from __future__ import annotations

import torch

from nystrom.utils.checks import (
    check_mask,
    check_qkv,
    rejects_key_padding_mask,
    resolve_scale,
    zero_padding,
)


def _check_projection(name: str, e: torch.Tensor, n: int, like: torch.Tensor) -> None:
    if not isinstance(e, torch.Tensor) or e.dim() != 2:
        shape = tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__
        raise ValueError(f"{name} must have shape (proj_len, max_seq_len), got {shape}")
    if e.shape[1] < n:
        raise ValueError(
            f"sequence length {n} exceeds max_seq_len={e.shape[1]} of the Linformer projection {name}"
            f" (shape {tuple(e.shape)}); build the module with max_seq_len >= {n}"
        )
    if not e.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {e.dtype}")
    if e.device != like.device:
        raise ValueError(f"{name} is on {e.device} but q is on {like.device}")


@rejects_key_padding_mask
def linformer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    e: torch.Tensor,
    f: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Linformer attention ``softmax(q (E k)^T * scale) (F v)``.

    Args:
        q, k: (b, h, n, d); v: (b, h, n, dv).
        e, f: (p, N) key and value projections, N >= n; the first n columns are used.
        mask: (b, n) bool, True = real token, or None.
        scale: logit scale, default ``1/sqrt(d)``.

    Returns:
        (b, h, n, dv).
    """
    b, _, n, d, _ = check_qkv(q, k, v)
    _check_projection("e", e, n, q)
    _check_projection("f", f, n, q)
    mask = check_mask(mask, b, n, q.device)
    q, k, v = zero_padding(mask, q, k, v)  # padded positions may hold NaN/Inf
    scale = resolve_scale(scale, d)
    if mask is not None:
        keep = mask[:, None, :, None]  # (b, 1, n, 1)
        k = k.masked_fill(~keep, 0.0)  # padded keys add nothing to E k
        v = v.masked_fill(~keep, 0.0)
    k_p = e[:, :n].to(k.dtype) @ k  # (b, h, p, d)
    v_p = f[:, :n].to(v.dtype) @ v  # (b, h, p, dv)
    attn = torch.softmax((q @ k_p.mT) * scale, dim=-1)  # (b, h, n, p)
    return attn @ v_p  # (b, h, n, dv)
