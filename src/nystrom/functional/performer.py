"""Performer FAVOR+ attention (Choromanski et al. 2020): positive orthogonal random features.

Legend: b batch, h heads, n tokens, d head dim, dv value dim, m random features.

With x already scaled by ``sqrt(scale)`` (so ``q·k * scale`` becomes ``x_q·x_k``), the softmax kernel
``exp(x_q·x_k) = E_w[phi(x_q) phi(x_k)]`` for ``w ~ N(0, I_d)`` and the positive feature map

    phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)        W: (m, d), rows w_1..w_m

Attention is then ``D^-1 phi(Q) (phi(K)^T V)`` with ``D = diag(phi(Q) phi(K)^T 1)``: O(n m d), no (n, n).
Rows of W are drawn in orthogonal blocks of d (QR of a Gaussian matrix) and rescaled to chi(d) lengths,
so each row is marginally N(0, I_d) and the estimator stays unbiased while its variance drops.

Stabilisation: before ``exp`` a query's logits are shifted by their own row max and the keys' by one
max per (b, h) over real keys; both shifts are constants that cancel between numerator and ``D``.
Padding: padded keys' features are set to zero, which removes them exactly from both sums, so a row
padded at its end equals the same row run at its real length (same W).
"""

from __future__ import annotations

import math

import torch

from nystrom.functional.checks import check_choice, check_key_padding_mask, check_positive_int, check_qkv

FEATURE_KINDS = ("plain", "query", "key")


def _resolve_scale(scale: float | None, d: int) -> float:
    """``scale`` as a positive finite float; None means ``1/sqrt(d)``."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if (
        not isinstance(scale, (int, float))
        or isinstance(scale, bool)
        or not math.isfinite(scale)
        or scale <= 0
    ):
        raise ValueError(f"scale must be a positive finite float or None (= 1/sqrt(head_dim)), got {scale!r}")
    return float(scale)


def orthogonal_random_features(
    num_features: int, dim: int, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Draw W (m, d) float32 on CPU: orthogonal blocks of d rows, each row scaled to a chi(d) length."""
    check_positive_int("num_features", num_features)
    check_positive_int("dim", dim)
    blocks = []
    for _ in range(-(-num_features // dim)):
        g = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        qm, r = torch.linalg.qr(g)
        qm = qm * torch.sign(torch.diagonal(r))  # sign fix makes the orthogonal matrix Haar-distributed
        blocks.append(qm.T)  # rows orthonormal
    w = torch.cat(blocks)[:num_features]  # (m, d)
    lengths = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1)  # (m,)
    return (w * lengths[:, None]).float()  # (m, d)


def favor_features(
    x: torch.Tensor,
    projection: torch.Tensor,
    *,
    kind: str = "plain",
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Positive random features ``phi(x) = exp(W x - |x|^2/2) / sqrt(m)``, optionally stabilised.

    Args:
        x: (b, h, n, d), already scaled by ``sqrt(scale)``.
        projection: W (m, d).
        kind: "plain" (the formula as is), "query" (times a per-row constant keeping the row max at
            ``1/sqrt(m)``) or "key" (times one constant per (b, h), padded keys zeroed).
        key_padding_mask: (b, n) bool, True = real token; only used by ``kind="key"``.

    Returns:
        (b, h, n, m).
    """
    check_choice("kind", kind, FEATURE_KINDS)
    if projection.dim() != 2 or projection.shape[1] != x.shape[-1]:
        raise ValueError(
            f"projection must have shape (num_features, {x.shape[-1]}), got {tuple(projection.shape)}"
        )
    m = projection.shape[0]
    logits = x @ projection.to(x.dtype).mT - (x * x).sum(-1, keepdim=True) / 2  # (b, h, n, m)
    if kind == "query":
        logits = logits - logits.detach().amax(-1, keepdim=True)  # (b, h, n, m)
    elif kind == "key":
        real = logits.detach()
        if key_padding_mask is not None:
            real = real.masked_fill(~key_padding_mask[:, None, :, None], -torch.inf)
        logits = logits - real.amax((-2, -1), keepdim=True)  # (b, h, n, m)
    phi = torch.exp(logits) / math.sqrt(m)  # (b, h, n, m)
    if kind == "key" and key_padding_mask is not None:
        phi = phi.masked_fill(~key_padding_mask[:, None, :, None], 0.0)
    return phi


def performer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    projection: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """FAVOR+ approximation of ``softmax(q k^T * scale) v``.

    Args:
        q, k: (b, h, n, d); v: (b, h, n, dv).
        projection: W (m, d), e.g. from :func:`orthogonal_random_features`.
        key_padding_mask: (b, n) bool, True = real token, or None.
        scale: logit scale, default ``1/sqrt(d)``.

    Returns:
        (b, h, n, dv).
    """
    b, _, n, d, _ = check_qkv(q, k, v)
    if not isinstance(projection, torch.Tensor) or projection.dim() != 2 or projection.shape[1] != d:
        shape = tuple(projection.shape) if isinstance(projection, torch.Tensor) else type(projection).__name__
        raise ValueError(f"projection must have shape (num_features, {d}), got {shape}")
    mask = check_key_padding_mask(key_padding_mask, b, n, q.device)
    root = _resolve_scale(scale, d) ** 0.5  # split the scale between q and k
    q_f = favor_features(q * root, projection, kind="query")  # (b, h, n, m)
    k_f = favor_features(k * root, projection, kind="key", key_padding_mask=mask)  # (b, h, n, m)
    kv = k_f.mT @ v  # (b, h, m, dv)
    denom = q_f @ k_f.sum(2).unsqueeze(-1)  # (b, h, n, 1)
    # the shifts put each row max at 1/sqrt(m), so denom only underflows for absurd logits; avoid 0/0
    return (q_f @ kv) / denom.clamp_min(torch.finfo(denom.dtype).tiny)  # (b, h, n, dv)
