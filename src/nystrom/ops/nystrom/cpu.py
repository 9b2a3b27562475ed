"""The CPU path of Nyström attention: the landmarks and A⁺ of :mod:`.landmarks`, and the two large products through
the memory-lean CPU kernels of :mod:`.cpu_kernels`, so no (n, m) or (m, n) matrix is ever alive.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim.

B·V is flash attention of the m landmark queries over the n keys (``long_key_attention``), and F·(A⁺BV)
a chunked attention of the n queries over the m landmarks (``short_key_attention``); below their
``*_MIN_N`` thresholds both run through PyTorch's SDPA instead.
"""

from __future__ import annotations

from nystrom.ops.nystrom.cpu_kernels import long_key_attention, short_key_attention
from nystrom.ops.nystrom.landmarks import landmark_kernel_pinv, landmark_means
from nystrom.utils.checks import check_finite, value_checks_enabled
from nystrom.utils.parallel import single_threaded


def nystrom_core(q, k, v, *, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale):
    """``nystrom_attention`` on checked inputs with zeroed (or finite) padding: (b, h, n, dv) in q's dtype."""
    dtype, m = q.dtype, num_landmarks
    q_l, k_l, valid = landmark_means(q, k, m, mask, segments)  # (b, h, m, d) x2, (b, m)
    with single_threaded(q_l.shape[0] * q_l.shape[1] * m**3 < 2**22):  # a few small matrices: one thread
        z = landmark_kernel_pinv(q_l, k_l, valid, scale, pinv_iterations, pinv, pinv_init)  # (b, h, m, m)
    bv = long_key_attention(q_l.to(dtype), k, v, key_mask=mask, scale=scale)  # (b, h, m, dv)  B·V
    check_finite("v at a real (unpadded) token", bv)
    w = (z @ bv.to(z.dtype)).to(dtype)  # (b, h, m, dv)  A⁺·(B·V)
    all_valid = value_checks_enabled(valid) and bool(valid.all())
    lvalid = None if all_valid else valid  # (b, m) only when a sample has < m real tokens
    return short_key_attention(q, k_l.to(dtype), w, valid=lvalid, scale=scale)  # (b, h, n, dv)
