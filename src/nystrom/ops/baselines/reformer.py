"""Reformer LSH attention (Kitaev et al. 2020) with shared query/key.

Legend: b batch, h heads, n tokens, d head dim, dv value dim, r hash rounds, u buckets (even),
c bucket (chunk) size, nc chunks per round, np = nc * c padded length.

Per round: angular LSH ``bucket(x) = argmax([x R; -x R])`` with a random rotation R (d, u/2); tokens are
sorted by (bucket, position) and cut into chunks of c; each chunk attends to itself and to the previous
chunk (chunk 0 to the last one, as Reformer's look-one-back). Keys are the *normalised* queries
(shared-QK), a token attends to itself only when no other key is available (its logit is set to
-5e4, Reformer's value), and the r rounds are combined with weights ``softmax_r(logsumexp of round r)``.
Duplicate (query, key) pairs across rounds are not de-duplicated (Reformer's default behaviour); with a
single chunk its look-back is itself, so every key appears twice, which leaves the softmax unchanged.

Padding is exact: padded tokens (and the zeros that pad n to a multiple of c) get the bucket id u, so
they sort after every real token and never displace one; inside each chunk padded keys are masked below
the self logit. A real token's output therefore never depends on padded tokens' content.
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

#: logit of a token attending to itself: low enough to lose against any real key, above padding
SELF_LOGIT = -5e4


def lsh_num_buckets(n: int, bucket_size: int) -> int:
    """Buckets for n tokens: one per chunk of ``bucket_size``, rounded up to an even number >= 2."""
    chunks = -(-n // bucket_size)
    return max(2, chunks + chunks % 2)


def random_rotations(
    n_hashes: int, dim: int, n_buckets: int, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Gaussian rotations R (r, d, u/2) float32 on CPU for angular LSH with u (even) buckets."""
    check_positive_int("n_hashes", n_hashes)
    check_positive_int("dim", dim)
    if not isinstance(n_buckets, int) or n_buckets < 2 or n_buckets % 2:
        raise ValueError(f"n_buckets must be an even int >= 2, got {n_buckets!r}")
    return torch.randn(n_hashes, dim, n_buckets // 2, generator=generator)


def lsh_buckets(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Angular LSH bucket ids: x (b, h, n, d), rotations (r, d, u/2) -> (b, h, r, n) int64 in [0, u)."""
    # hashing is a discrete decision: bf16 rounding of x R would flip near-tie buckets, so use >= float32
    acc = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(x.device.type, enabled=False):
        rotated = torch.einsum("bhnd,rdk->bhrnk", x.to(acc), rotations.to(acc))  # (b, h, r, n, u/2)
    # argmax over [xR, -xR] without building it; ties go to the xR half, as a concatenation's argmax would
    top, arg_top = rotated.max(-1)  # (b, h, r, n)
    low, arg_low = rotated.min(-1)  # (b, h, r, n)
    return torch.where(top >= -low, arg_top, arg_low + rotated.shape[-1])  # (b, h, r, n)


def _look_one_back(x: torch.Tensor) -> torch.Tensor:
    """(b, h, r, nc, c, ...) -> (b, h, r, nc, 2c, ...): each chunk followed by the previous one."""
    return torch.cat((x, x.roll(1, dims=3)), dim=4)


@rejects_key_padding_mask
def lsh_attention(
    qk: torch.Tensor,
    v: torch.Tensor,
    rotations: torch.Tensor,
    *,
    bucket_size: int = 64,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Shared-QK LSH attention.

    Args:
        qk: (b, h, n, d) shared queries/keys (keys are ``qk / |qk|``); v: (b, h, n, dv).
        rotations: (r, d, u/2), e.g. ``random_rotations(r, d, lsh_num_buckets(n, bucket_size))``.
        bucket_size: chunk length c.
        mask: (b, n) bool, True = real token, or None.
        scale: logit scale, default ``1/sqrt(d)``.

    Returns:
        (b, h, n, dv).
    """
    b, h, n, d, dv = check_qkv(qk, qk, v)
    c = check_positive_int("bucket_size", bucket_size)
    if not isinstance(rotations, torch.Tensor) or rotations.dim() != 3 or rotations.shape[1] != d:
        shape = tuple(rotations.shape) if isinstance(rotations, torch.Tensor) else type(rotations).__name__
        raise ValueError(f"rotations must have shape (n_hashes, {d}, n_buckets // 2), got {shape}")
    mask = check_mask(mask, b, n, qk.device)
    qk, v = zero_padding(mask, qk, v)  # padded positions may hold NaN/Inf
    scale = resolve_scale(scale, d)
    r, u = rotations.shape[0], 2 * rotations.shape[2]
    nc = -(-n // c)
    n_pad = nc * c
    dev = qk.device

    padded = n_pad > n or mask is not None
    qk = torch.nn.functional.pad(qk, (0, 0, 0, n_pad - n))  # (b, h, np, d)
    # a ones column on v makes the softmax normaliser come out of the same matmul as the output
    v1 = torch.nn.functional.pad(torch.cat((v, v.new_ones(b, h, n, 1)), -1), (0, 0, 0, n_pad - n))
    valid = torch.zeros(b, n_pad, dtype=torch.bool, device=dev)
    valid[:, :n] = True if mask is None else mask

    buckets = lsh_buckets(qk, rotations.to(dev))  # (b, h, r, np)
    if padded:
        buckets = buckets.masked_fill(~valid[:, None, None, :], u)  # padding sorts after every real token
    pos = torch.arange(n_pad, device=dev)
    sticker = (buckets * n_pad + pos).argsort(dim=-1)  # (b, h, r, np) unique keys: deterministic order
    undo = torch.empty_like(sticker).scatter_(-1, sticker, pos.expand_as(sticker))  # inverse permutation
    window = _look_one_back(sticker.unflatten(3, (nc, c))).flatten(3)  # (b, h, r, nc * 2c) key tokens

    def take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Rows ``idx`` (b, h, r, t) of x (b, h, np, e) -> (b, h, r, t, e)."""
        # whole-row index_select: about twice as fast on CPU as an element-wise gather
        flat = idx + n_pad * torch.arange(b * h, device=dev).view(b, h, 1, 1)  # (b, h, r, t) row ids
        rows = x.reshape(b * h * n_pad, x.shape[-1])  # not -1: ambiguous for an empty batch (b = 0)
        return rows.index_select(0, flat.flatten()).view(*idx.shape, x.shape[-1])

    s_q = take(qk, sticker).unflatten(3, (nc, c))  # (b, h, r, nc, c, d)
    s_k = take(torch.nn.functional.normalize(qk, p=2.0, dim=-1), window).unflatten(3, (nc, 2 * c))
    s_v1 = take(v1, window).unflatten(3, (nc, 2 * c))  # (b, h, r, nc, 2c, dv + 1)

    dots = (s_q * scale) @ s_k.mT  # (b, h, r, nc, c, 2c)
    # query i of a chunk is key i of its window (own chunk first); with one chunk, also key c + i
    for half in range(2 if nc == 1 else 1):
        dots[..., half * c : (half + 1) * c].diagonal(dim1=-2, dim2=-1).fill_(SELF_LOGIT)
    if padded:
        key_valid = valid[:, None, None, :].expand(b, h, r, n_pad).gather(3, window)  # (b, h, r, nc * 2c)
        dots.masked_fill_(~key_valid.unflatten(3, (nc, 1, 2 * c)), torch.finfo(dots.dtype).min)
    top = dots.detach().amax(-1, keepdim=True)  # (b, h, r, nc, c, 1)
    weights = (dots - top).exp_()  # (b, h, r, nc, c, 2c); in place is safe: `dots - top` is fresh
    del dots  # nothing saved it for backward: free it before the value matmul (peak memory)
    o1 = weights @ s_v1  # (b, h, r, nc, c, dv + 1)
    s_out = o1[..., :dv] / o1[..., dv:]  # (b, h, r, nc, c, dv); the normaliser is >= 1 (the max term)
    lse = top + torch.log(o1[..., dv:])  # (b, h, r, nc, c, 1) log-sum-exp of each row

    flat = undo + n_pad * torch.arange(b * h * r, device=dev).view(b, h, r, 1)  # (b, h, r, np) row ids
    out = s_out.reshape(-1, dv).index_select(0, flat.flatten()).view(b, h, r, n_pad, dv)  # unsorted
    lse = lse.flatten(3, 5).gather(3, undo)  # (b, h, r, np)
    mix = torch.softmax(lse, dim=2).unsqueeze(-1)  # (b, h, r, np, 1) round weights
    return (out * mix).sum(2)[:, :, :n]  # (b, h, n, dv)
