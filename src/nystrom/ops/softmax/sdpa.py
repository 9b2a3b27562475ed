"""Exact softmax attention through PyTorch's ``scaled_dot_product_attention``.

Legend: b batch, h heads, n queries, n_k keys, d head dim, dv value dim.

:func:`masked_sdpa` is the one masked SDPA call of the library's plain paths: softmax attention itself,
and the traceable Nyström path (:mod:`nystrom.ops.nystrom.traceable`), whose two products are softmax
attentions over the landmarks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nystrom.ops.plan import is_packed, run_packed
from nystrom.utils.checks import (
    check_bool,
    check_mask,
    check_qkv,
    rejects_key_padding_mask,
    resolve_scale,
    zero_padding,
)
from nystrom.utils.device import accelerator_path


def masked_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(q kᵀ·scale) v with ``key_mask`` (b, n_k) False keys excluded: q (b, h, n, d), k (b, h, n_k, d),
    v (b, h, n_k, dv) -> (b, h, n, dv).

    Under ``torch.export`` the product is written out, with the mask as an additive (b, 1, 1, n_k) bias of
    the dtype's lowest finite value: torch.onnx translates a boolean-masked SDPA into a Where over the whole
    (b, h, n, n_k) score tensor and a second one that zeroes NaN rows, which ONNX Runtime runs slowly
    (MiniLM size at 4K tokens: a tenth of the graph's time). Unmasked too: torch.onnx's decomposition of SDPA
    leaves an explicit Transpose of k that ORT then runs, with a slower Softmax (35 vs 19 ms per call for the
    m landmark queries at 16K tokens, MiniLM size). The bias gives the same probabilities (a masked
    key's exp underflows to an exact 0); a row whose keys are all masked (a sample of padding only) averages
    its finite padded values instead of returning 0 (either is the padding's output, which nothing reads).
    """
    if torch.compiler.is_exporting():
        scores = (q * scale) @ k.transpose(-1, -2)  # (b, h, n, n_k)
        if key_mask is not None:
            bias = torch.zeros(key_mask.shape, dtype=q.dtype, device=q.device)  # (b, n_k)
            scores = scores + bias.masked_fill(~key_mask, torch.finfo(q.dtype).min)[:, None, None, :]
        return scores.softmax(-1) @ v  # (b, h, n, dv)
    attn_mask = None if key_mask is None else key_mask[:, None, None, :]  # (b, 1, 1, n_k)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)


@rejects_key_padding_mask
def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    padded_finite: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """Exact softmax attention (SDPA): q, k (b, h, n, d), v (b, h, n, dv) -> (b, h, n, dv).

    ``mask`` (b, n) bool, True = real token; padded positions may hold any values (NaN, Inf).
    ``padded_finite``: the caller guarantees finite values at padded positions (the modules' projections
    of zeroed inputs), so they need not be zeroed: a padded key's probability is an exact 0, and 0 times a
    finite value is 0 (saves three masked fills a call, forward and backward: launches on a GPU; on the
    CPU the fills run anyway, as the layout copies that SDPA's CPU kernel is faster with).
    ``cu_seqlens``, ``max_seqlen``: packed documents, each attending only to itself, as in
    :func:`~nystrom.ops.nystrom.dispatch.nystrom_attention` (every document a sample of its own).
    """
    b, h, n, d, _ = check_qkv(q, k, v)
    mask = check_mask(mask, b, n, q.device)
    if is_packed(cu_seqlens, max_seqlen):

        def attend(qd: torch.Tensor, kd: torch.Tensor, vd: torch.Tensor, md: torch.Tensor) -> torch.Tensor:
            return softmax_attention(qd, kd, vd, mask=md, scale=scale, padded_finite=padded_finite)

        return run_packed(attend, q, k, v, mask=mask, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
    # The op's one device question. On the CPU the fills stay: they also lay the head views out
    # contiguously, and SDPA's CPU kernel runs strided head views about 8 % slower (MiniLM size, 4K
    # tokens). On an accelerator its kernel takes the views as they are, and the fills are launches only.
    skip = check_bool("padded_finite", padded_finite) and accelerator_path(q)
    q, k, v = zero_padding(mask, q, k, v, padded_finite=skip)
    return masked_sdpa(q, k, v, mask, resolve_scale(scale, d))
