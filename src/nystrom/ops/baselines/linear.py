"""ELU linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), non-causal.

Legend: b batch, h heads, n tokens, d head dim, dv value dim.

With the feature map ``phi(x) = elu(x) + 1`` (positive everywhere) the softmax kernel ``exp(q·k)`` is
replaced by ``phi(q)·phi(k)``, and associativity gives attention in O(n·d·dv) time and O(d·dv) state:

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T)  /  phi(q_i)^T (sum_j phi(k_j))

No ``1/sqrt(d)`` scale: the paper's formula has none (the ratio is not invariant to scaling q or k
before ``phi``, so adding one would be a different model). The Nyströmformer paper's Figure 5 compares
against this method ("linear").

Padding: padded keys and values are zeroed *before* ``phi`` and their features zeroed after, so they add
nothing to either sum whatever their content (NaN included) and get no gradient; a row padded at its end
equals the same row run at its real length. Padded queries still get an output (of real keys only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nystrom.utils.checks import check_mask, check_qkv, rejects_key_padding_mask, zero_padding


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1`` elementwise: positive, ``x + 1`` for x > 0 and ``exp(x)`` below."""
    return F.elu(x) + 1.0


@rejects_key_padding_mask
def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Non-causal ELU linear attention.

    Args:
        q, k: (b, h, n, d); v: (b, h, n, dv).
        mask: (b, n) bool, True = real token, or None.

    Returns:
        (b, h, n, dv), in the inputs' dtype.
    """
    b, _, n, _, _ = check_qkv(q, k, v)
    mask = check_mask(mask, b, n, q.device)
    # zero the inputs first: 0 * NaN is NaN, and elu's backward at a NaN input would be NaN too
    q, k, v = zero_padding(mask, q, k, v)
    k_f = elu_feature_map(k)  # (b, h, n, d)
    if mask is not None:
        k_f = k_f.masked_fill(~mask[:, None, :, None], 0.0)  # padded keys carry no feature mass
    q_f = elu_feature_map(q)  # (b, h, n, d)
    # a ones column on v gives the normaliser from the same two matmuls as the numerator
    v1 = torch.cat((v, v.new_ones(*v.shape[:-1], 1)), dim=-1)  # (b, h, n, dv + 1)
    out = q_f @ (k_f.mT @ v1)  # (b, h, d, dv + 1) state, then (b, h, n, dv + 1)
    # the normaliser is > 0 in exact arithmetic (phi > 0) but can underflow for very negative logits:
    # clamp so that 0/0 cannot give NaN
    return out[..., :-1] / out[..., -1:].clamp_min(torch.finfo(out.dtype).tiny)  # (b, h, n, dv)
