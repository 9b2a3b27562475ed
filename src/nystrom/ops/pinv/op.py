"""``nystrom::iterative_pinv``: the pseudo-inverse iterations of :mod:`nystrom.ops.pinv.iterations` as one op.

Legend: B batch dims (b, h), m landmarks, K iterations; Z_k the iterate before step k (Z₀ the start).

Why an op: traced op by op, the 6 paper iterations are ~75 launches forward and ~117 backward per layer,
which on a GPU cost more than their FLOPs. As a ``torch.library`` custom op it is one launch forward on
CUDA (the Triton kernel of :mod:`nystrom.ops.pinv.triton`, float32, m ≤ 128, per-matrix Z₀) and the
plain-ops iterations of :mod:`nystrom.ops.pinv.iterations` elsewhere; its fake kernel lets
``torch.compile`` and the meta device trace it.

The backward is written out (reverse mode through the K steps): with Y = A Z_k, P = 7I − Y,
Q = 15I − Y P, R = 13I − Y Q and Z_{k+1} = ¼ Z_k R, a gradient G of Z_{k+1} gives
``∂R = ¼ Z_kᵀ G``, ``∂Q = −Yᵀ ∂R``, ``∂P = −Yᵀ ∂Q``, ``∂Y = −∂R Qᵀ − ∂Q Pᵀ − ∂P``,
``∂A += ∂Y Z_kᵀ`` and ``∂Z_k = ¼ G Rᵀ + Aᵀ ∂Y``; Z₀'s norms go through autograd. The forward hands
the iterates Z_0 … Z_{K-1} to the backward, so every step's Y, P, Q, R come from a few GEMMs batched over
the K steps; the reverse sweep is 8 GEMMs a step with the scalars folded in (baddbmm's alpha/beta).

Autocast: the op has an autocast rule on every device that has autocast (its inputs are cast to float32,
float64 is kept, and it runs with autocast off), and its backward runs with autocast off. Without the
second, a ``backward()`` called inside an autocast block (autograd runs the backward under the caller's
autocast state) would run the reverse sweep's GEMMs in bfloat16 and accumulate them into float32 buffers.
"""

from __future__ import annotations

import torch

from nystrom.ops.pinv import triton as pinv_triton
from nystrom.ops.pinv.iterations import initial_iterate, run_iterations
from nystrom.utils.amp import autocast_off


@torch.library.custom_op("nystrom::iterative_pinv", mutates_args=())
def iterative_pinv_op(
    a: torch.Tensor, iterations: int, per_matrix: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Z_K for square ``a`` (..., m, m) in float32 or float64 (the caller has promoted half precision),
    and the iterates Z_0 … Z_{K-1} (..., K, m, m) the backward reads (K·m² floats per matrix)."""
    iterates = a.new_empty(*a.shape[:-2], iterations, *a.shape[-2:])
    if a.device.type == "cuda" and per_matrix and pinv_triton.supports(a) and pinv_triton.available():
        return pinv_triton.triton_pinv(a, iterations, iterates), iterates
    return run_iterations(a, iterations, per_matrix, iterates), iterates


@iterative_pinv_op.register_fake
def _(a: torch.Tensor, iterations: int, per_matrix: bool) -> tuple[torch.Tensor, torch.Tensor]:
    iterates = a.new_empty(*a.shape[:-2], iterations, *a.shape[-2:])
    return torch.empty_like(a, memory_format=torch.contiguous_format), iterates


def _setup(ctx, inputs, output) -> None:
    a, iterations, per_matrix = inputs
    ctx.save_for_backward(a, output[1])
    ctx.per_matrix = per_matrix
    ctx.mark_non_differentiable(output[1])


def pinv_backward(
    a: torch.Tensor, iterates: torch.Tensor, grad: torch.Tensor, per_matrix: bool
) -> torch.Tensor:
    """∂A for the gradient ``grad`` of Z_K, from A and the iterates Z_0 … Z_{K-1} (..., K, m, m)."""
    shape, m, steps = a.shape, a.shape[-1], iterates.shape[-3]
    with torch.enable_grad():
        a0 = a.detach().requires_grad_()
        z0 = initial_iterate(a0, per_matrix)  # (..., m, m): the norms' (sub)gradients as autograd takes them
    batch = a.numel() // (m * m) if m else 0  # explicit, not -1: K = 0 or m = 0 leaves -1 ambiguous
    af = a.detach().reshape(batch, m, m)  # (B, m, m)
    zs = iterates.reshape(batch, steps, m, m)  # (B, K, m, m)
    # Every step's Y, P, Q, R at once (batched over the K steps): the iterates are known.
    eye = torch.eye(m, dtype=a.dtype, device=a.device)
    ys = torch.matmul(af[:, None], zs)  # (B, K, m, m) Y_k = A Z_k
    ps = (7 * eye) - ys  # 7I − Y
    flat = lambda t: t.reshape(batch * steps, m, m)  # noqa: E731  (B·K, m, m), a view: contiguous
    qs = torch.baddbmm(15 * eye, flat(ys), flat(ps), alpha=-1).view_as(ys)  # 15I − Y P
    rs = torch.baddbmm(13 * eye, flat(ys), flat(qs), alpha=-1).view_as(ys)  # 13I − Y Q
    h = grad.reshape(batch, m, m).to(a.dtype).mul(0.25)  # (B, m, m) H = ¼ ∂Z_K: the ¼ is carried along
    da = torch.zeros_like(af)
    for k in range(steps - 1, -1, -1):
        y, p, q, r, z = ys[:, k], ps[:, k], qs[:, k], rs[:, k], zs[:, k]  # (B, m, m) each
        dr = torch.bmm(z.mT, h)  # ∂R = ¼ Zᵀ G
        dq = torch.bmm(y.mT, dr)  # −∂Q = Yᵀ ∂R
        dp = torch.bmm(y.mT, dq)  # ∂P = Yᵀ (−∂Q)
        dy = torch.baddbmm(dp, dr, q.mT, beta=-1, alpha=-1).baddbmm_(dq, p.mT)  # −∂P − ∂R Qᵀ − ∂Q Pᵀ
        da.baddbmm_(dy, z.mT)  # ∂A += ∂Y Zᵀ
        h = torch.baddbmm(torch.bmm(h, r.mT), af.mT, dy, beta=0.25, alpha=0.25)  # ¼ ∂Z_k = ¼ (G Rᵀ + Aᵀ ∂Y)
    (d_start,) = torch.autograd.grad(z0, a0, h.view(shape).mul(4))
    return da.view(shape) + d_start


def _backward(ctx, grad, _grad_iterates):
    a, iterates = ctx.saved_tensors
    with autocast_off(a.device.type):  # the sweep's dtypes are chosen on purpose (float32 or wider)
        return pinv_backward(a, iterates, grad, ctx.per_matrix), None, None


iterative_pinv_op.register_autograd(_backward, setup_context=_setup)
#: the devices with autocast that the op declares a rule for (a custom op without one would run in the
#: autocast dtype's world with float32 inputs: the caller's promotion would be undone downstream)
#: torch.library.register_autocast arrived after torch 2.4, our floor: there the op has no rule, and its
#: callers' promotion to float32 (the dispatch casts up, the attention runs with autocast off) is what holds
AUTOCAST_DEVICES = (
    tuple(d for d in ("cpu", "cuda", "xpu", "mps") if torch.amp.is_autocast_available(d))
    if hasattr(torch.library, "register_autocast")
    else ()
)
for _device in AUTOCAST_DEVICES:
    torch.library.register_autocast("nystrom::iterative_pinv", _device, torch.float32)
