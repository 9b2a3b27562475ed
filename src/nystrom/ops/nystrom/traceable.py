"""The traceable path of Nyström attention: what ``torch.compile`` and ``torch.export`` trace on any device.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim.

The compiler cannot follow the CPU kernels (a thread pool, custom autograd Functions), so under tracing
the reference's landmarks and A⁺ meet two masked SDPA calls, which compute the same function: B·V with
the m landmark queries over the n keys, F·(A⁺BV) with the n queries over the m landmarks.
"""

from __future__ import annotations

from nystrom.ops.nystrom.naive import landmark_kernel_pinv, landmark_means
from nystrom.ops.softmax import masked_sdpa
from nystrom.utils.checks import check_finite


def nystrom_core(q, k, v, *, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale):
    """``nystrom_attention`` on checked inputs with zeroed (or finite) padding: (b, h, n, dv) in q's dtype."""
    dtype = q.dtype
    q_l, k_l, valid = landmark_means(q, k, num_landmarks, mask, segments)  # (b, h, m, d) x2, (b, m)
    z = landmark_kernel_pinv(q_l, k_l, valid, scale, pinv_iterations, pinv, pinv_init)  # (b, h, m, m)
    bv = masked_sdpa(q_l.to(dtype), k, v, mask, scale)  # (b, h, m, dv)  B·V
    check_finite("v at a real (unpadded) token", bv)
    w = (z @ bv.to(z.dtype)).to(dtype)  # (b, h, m, dv)  A⁺·(B·V)
    return masked_sdpa(q, k_l.to(dtype), w, valid, scale)  # (b, h, n, dv)
