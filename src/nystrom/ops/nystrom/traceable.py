"""The traceable path of Nyström attention: what ``torch.compile`` and ``torch.export`` trace on any device.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim.

The compiler cannot follow the CPU kernels (a thread pool, custom autograd Functions), so under tracing
the landmarks and A⁺ of :mod:`.landmarks` meet two masked SDPA calls, which compute the same function: B·V with
the m landmark queries over the n keys, F·(A⁺BV) with the n queries over the m landmarks.

B·V runs in A⁺'s dtype (≥ float32), with k and v cast up, so that A⁺·(B·V) multiplies two float32
operands. Why: with a half-precision B·V cast up for that product, the compiled backward holds a float32
GEMM followed by the cast back to half precision, and torch 2.13's inductor, compiling a function that
opens ``torch.autocast`` itself, dropped that cast and handed a float32 gradient to SDPA's half-precision
backward ("expected scalar type BFloat16 but found Float"). The cost: k and v in float32 for the m
landmark queries' pass (m·n·d FLOPs, small beside the n queries' pass).
"""

from __future__ import annotations

from nystrom.ops.nystrom.landmarks import landmark_kernel_pinv, landmark_means
from nystrom.ops.softmax import masked_sdpa
from nystrom.utils.checks import check_finite


def nystrom_core(q, k, v, *, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale):
    """``nystrom_attention`` on checked inputs with zeroed (or finite) padding: (b, h, n, dv) in q's dtype."""
    dtype = q.dtype
    q_l, k_l, valid = landmark_means(q, k, num_landmarks, mask, segments)  # (b, h, m, d) x2, (b, m)
    z = landmark_kernel_pinv(q_l, k_l, valid, scale, pinv_iterations, pinv, pinv_init)  # (b, h, m, m)
    acc = z.dtype  # ≥ float32
    bv = masked_sdpa(q_l, k.to(acc), v.to(acc), mask, scale)  # (b, h, m, dv)  B·V, in acc
    check_finite("v at a real (unpadded) token", bv)
    w = (z @ bv).to(dtype)  # (b, h, m, dv)  A⁺·(B·V)
    return masked_sdpa(q, k_l.to(dtype), w, valid, scale)  # (b, h, n, dv)
