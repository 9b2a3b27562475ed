"""Head-by-head recomputation of an attention layer in the backward (``recompute=True``).

Legend: b batch, n tokens, e model dim, h heads, d head dim, g heads per group, U = one (b, n, e) tensor.

Why: a training step of an attention layer keeps its joint q/k/v projection (3 U) from the forward to the
backward, and the backward holds their three gradients (3 U) beside it, so a module's peak training
memory is ≈ 7 U however lean its core is. Every head of q/k/v is a function of ``x`` and that head's
rows of the projection only, and (for the variants that allow it) every head's core is independent of
the others', so the backward can rebuild one group of heads at a time from the saved ``x``, run that
group's core forward and backward (the same kernels, through autograd), and fold its gradients into
∂x and ∂W at once. Nothing 3 U-sized lives at any moment: the forward runs by the same groups and keeps only
``x`` (which the caller holds anyway); the backward allocates ∂x plus one group's q/k/v and gradients.

Cost: the backward recomputes the projection (2·n·e·3e FLOPs, +25 % of the layer's projection FLOPs)
and the core's forward: measured figures are in docs/benchmarks.md. Exact: the same arithmetic as the
plain path, so results agree to rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from nystrom.layers.projection import fold_linear_grad
from nystrom.utils.memory import empty

# One group's q/k/v (b, n, 3, g, d) stays under this many bytes (at least one head): at long n one head
# at a time (measured at n = 65536: 32 MiB groups 792 MB peak, 128 MiB 830, 256 MiB 1232), while short
# sequences take all heads at once (one GEMM per projection, as the plain path).
GROUP_BYTES = 32 << 20
# The forward's groups may be larger: its peak (merged heads + output + one group) stays below the
# backward's, and fewer, larger GEMMs are faster (n = 65536 forward: 1124 ms by 32 MiB, 1070 by 128 MiB).
FORWARD_GROUP_BYTES = 128 << 20

#: ``attend(q, k, v (b, g, n, d), mask (b, n) | None, conv_weight (g, 1, K, 1) | None) -> (b, n, g·d)``
Attend = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"], torch.Tensor
]


def head_groups(b: int, n: int, h: int, d: int, itemsize: int, *, limit: int | None = None) -> list[slice]:
    """Slices of heads whose q/k/v (b, n, 3, g, d) stays under ``limit`` bytes (``GROUP_BYTES``)."""
    per_head = max(1, b * n * 3 * d * itemsize)
    g = max(1, min(h, (GROUP_BYTES if limit is None else limit) // per_head))
    return [slice(i, min(h, i + g)) for i in range(0, h, g)]


def _project(x: torch.Tensor, w3: torch.Tensor, b3: torch.Tensor | None, hs: slice) -> list[torch.Tensor]:
    """q, k, v of heads ``hs``, each (b, n, g·d) contiguous, from the (3, h, d, e) weight view."""
    g, d, e = hs.stop - hs.start, w3.shape[2], w3.shape[3]
    return [
        F.linear(x, w3[i, hs].reshape(g * d, e), None if b3 is None else b3[i, hs].reshape(g * d))
        for i in range(3)
    ]


def _heads(t: torch.Tensor, g: int) -> torch.Tensor:
    return t.unflatten(-1, (g, -1)).transpose(1, 2)  # (b, n, g·d) -> (b, g, n, d) view


class _Recompute(torch.autograd.Function):
    """``x -> out_proj(attend(q, k, v))`` by head groups, saving only ``x`` and the weights.

    The forward goes by groups (no 3 U projection exists) and frees the merged heads once projected; the
    backward recomputes each group's q/k/v and attention output, forms that group's share of ∂W_out from
    it, and folds its q/k/v gradients into ∂x and ∂W_qkv at once.
    """

    @staticmethod
    def forward(ctx, x, mask, w_qkv, b_qkv, conv_w, w_out, b_out, attend, heads):
        ctx.save_for_backward(x, mask, w_qkv, b_qkv, conv_w, w_out)
        ctx.attend, ctx.heads, ctx.has_b_out = attend, heads, b_out is not None
        dev = x.device.type  # the backward recomputes under the forward's autocast state
        ctx.amp = (dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        b, n, e = x.shape
        d = w_qkv.shape[0] // (3 * heads)
        w3 = w_qkv.view(3, heads, d, e)
        b3 = None if b_qkv is None else b_qkv.view(3, heads, d)
        groups = head_groups(b, n, heads, d, x.element_size(), limit=FORWARD_GROUP_BYTES)
        o = None if len(groups) == 1 else empty(b, n, heads * d, like=x)  # (b, n, h·d) merged heads
        for hs in groups:
            g = hs.stop - hs.start
            q, k, v = (_heads(t, g) for t in _project(x, w3, b3, hs))  # (b, g, n, d) each
            cw = None if conv_w is None else conv_w[hs]  # (g, 1, K, 1)
            og = attend(q, k, v, mask, cw)  # (b, n, g·d)
            if o is None:
                o = og
            else:
                o[:, :, hs.start * d : hs.stop * d] = og
            del q, k, v, og
        return F.linear(o, w_out, b_out)  # (b, n, e)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, mask, w_qkv, b_qkv, conv_w, w_out = ctx.saved_tensors
        attend, h = ctx.attend, ctx.heads
        b, n, e = x.shape
        d = w_qkv.shape[0] // (3 * h)
        need = ctx.needs_input_grad
        w3 = w_qkv.view(3, h, d, e)
        b3 = None if b_qkv is None else b_qkv.view(3, h, d)
        dev, amp, amp_dtype = ctx.amp
        dt = grad_out.dtype  # the forward's compute dtype: the products below run in it (as autograd's would)
        x2, gy = x.reshape(b * n, e).to(dt), grad_out.reshape(b * n, e)  # (b·n, e)
        dx = None  # (b·n, e) in dt, summed over groups; returned in x's dtype
        dw3 = w3.new_zeros(w3.shape) if need[2] else None  # (3, h, d, e)
        db3 = None if b3 is None or not need[3] else b3.new_zeros(b3.shape)
        dconv = None if conv_w is None or not need[4] else torch.zeros_like(conv_w)
        dw_out = torch.zeros_like(w_out) if need[5] else None  # (e, h·d)
        for hs in head_groups(b, n, h, d, x.element_size()):
            g, cols = hs.stop - hs.start, slice(hs.start * d, hs.stop * d)
            with torch.enable_grad(), torch.autocast(dev, dtype=amp_dtype, enabled=amp):
                qkv = [t.requires_grad_() for t in _project(x, w3, b3, hs)]  # leaves (b, n, g·d)
                cw = None if conv_w is None else conv_w[hs].detach().requires_grad_()
                o = attend(*(_heads(t, g) for t in qkv), mask, cw)  # (b, n, g·d)
                if dw_out is not None:
                    dw_out[:, cols] = gy.mT @ o.detach().reshape(b * n, g * d).to(dt)  # ∂W_out = ∂yᵀ · o
                go = (gy @ w_out[:, cols].to(dt)).view(b, n, g * d).to(o.dtype)  # ∂o of this group
                inputs = qkv if cw is None else [*qkv, cw]
                grads = torch.autograd.grad(o, inputs, go)
            del o, go
            for i, gt in enumerate(grads[:3]):  # ∂q, ∂k, ∂v of the group (b, n, g·d)
                dx = fold_linear_grad(
                    gt.reshape(b * n, g * d).to(dt), x2, w3[i, hs].reshape(g * d, e).to(dt), dx,
                    need_x=need[0], dw=None if dw3 is None else dw3[i, hs].view(g * d, e),
                    db=None if db3 is None else db3[i, hs].view(g * d),
                )  # fmt: skip
            if dconv is not None:
                dconv[hs] = grads[3]
        db_out = gy.sum(0) if ctx.has_b_out and need[6] else None
        return (
            None if dx is None else dx.view_as(x).to(x.dtype),
            None,
            None if dw3 is None else dw3.view_as(w_qkv),
            None if db3 is None else db3.view_as(b_qkv),
            dconv,
            dw_out,
            db_out,
            None,
            None,
        )


def recompute_attention(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    conv_weight: torch.Tensor | None,
    w_out: torch.Tensor,
    b_out: torch.Tensor | None,
    *,
    attend: Attend,
    heads: int,
) -> torch.Tensor:
    """``F.linear(attend(q, k, v, mask, conv_weight), w_out, b_out)`` (b, n, e) keeping only ``x``.

    ``x`` (b, n, e); ``w_qkv`` (3·h·d, e) and ``b_qkv`` (3·h·d,) in the joint (3, h, d) row layout;
    ``conv_weight`` (h, 1, K, 1) or None; ``w_out`` (e, h·d). ``attend`` must treat heads independently
    and deterministically (it runs on groups of heads, twice). Eager only: raises under
    ``torch.compile``, whose partitioner makes its own recomputation choices.
    """
    if torch.compiler.is_compiling():
        raise RuntimeError(
            "recompute=True is an eager-mode memory saver that torch.compile cannot trace; build the"
            " attention with recompute=False when compiling (the compiler decides what to recompute)"
        )
    return _Recompute.apply(x, mask, w_qkv, b_qkv, conv_weight, w_out, b_out, attend, heads)
