"""Reformer LSH attention module (Kitaev et al. 2020).

Legend: b batch, h heads, n tokens, d head dim, r hash rounds, u buckets.
"""

from __future__ import annotations

import torch

from nystrom.attention.base import AttentionBase
from nystrom.ops.baselines.reformer import lsh_attention, lsh_num_buckets, random_rotations
from nystrom.utils.checks import check_positive_int


class ReformerAttention(AttentionBase):
    """Shared-QK LSH self-attention with ``n_hashes`` rounds and chunks of ``bucket_size`` tokens.

    Reformer ties keys to queries: the k block of the joint q/k/v projection is computed by the base but
    *not used* (its weights get zero gradient); keys are the normalised queries. The number of buckets
    follows the input, u = ``lsh_num_buckets(n, bucket_size)``, so the random rotations (r, d, u/2) are
    drawn per call: from ``seed`` (the same hashing on every call: deterministic, reproducible) or,
    with ``seed=None``, fresh from torch's global RNG each call (Reformer's training behaviour).
    The padding mask is honoured exactly (see :mod:`nystrom.ops.baselines.reformer`).

    Args:
        dim: model width.
        heads, dim_head: h and d.
        n_hashes: r hash rounds (2 in the Nyströmformer paper's comparisons).
        bucket_size: c, the chunk length (64).
        seed: seed of the rotations, or None to redraw them on every call.
        qkv_bias, dropout: as in :class:`AttentionBase`.
    """

    name = "reformer"

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 8,
        dim_head: int = 64,
        n_hashes: int = 2,
        bucket_size: int = 64,
        seed: int | None = 0,
        qkv_bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(dim, heads=heads, dim_head=dim_head, qkv_bias=qkv_bias, dropout=dropout)
        self.n_hashes = check_positive_int("n_hashes", n_hashes)
        self.bucket_size = check_positive_int("bucket_size", bucket_size)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int or None, got {seed!r}")
        self.seed = seed

    def rotations(self, n: int) -> torch.Tensor:
        """The rotations (r, d, u/2) used for an input of n tokens (float32, CPU)."""
        gen = None if self.seed is None else torch.Generator().manual_seed(self.seed)
        u = lsh_num_buckets(n, self.bucket_size)
        return random_rotations(self.n_hashes, self.dim_head, u, generator=gen)

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d); ``k`` is ignored (shared-QK)."""
        rot = self.rotations(q.shape[2]).to(q.device)
        return lsh_attention(q, v, rot, bucket_size=self.bucket_size, mask=mask)

    def extra_repr(self) -> str:
        opts = f"n_hashes={self.n_hashes}, bucket_size={self.bucket_size}, seed={self.seed}"
        return f"{super().extra_repr()}, {opts}"
