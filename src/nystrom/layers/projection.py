"""The joint q/k/v projection split into heads, with a backward that needs no joint gradient.

Legend: b batch, n tokens, e model dim, h heads, d head dim, k rows of one weight slice (g·d or h·d).

The weight is ``(3·h·d, e)`` in the ``(3, h, d)`` row layout (q rows, then k, then v; within each, head
by head), the layout of HF's and our checkpoints once q/k/v are stacked.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nystrom.layers.dense import dense, fuses
from nystrom.utils.device import accelerator_path


def split_heads(
    qkv: torch.Tensor, heads: int, dim_head: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, n, 3·h·d) joint q/k/v projection -> q, k, v views (b, h, n, d) (the ``(3, h, d)`` column layout).
    The traced path of :func:`project_heads`; eagerly that one's backward avoids autograd's copies."""
    return qkv.unflatten(-1, (3, heads, dim_head)).permute(2, 0, 3, 1, 4).unbind(0)


def project_heads(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    heads: int,
    dim_head: int,
    *,
    key_bias_cancels: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The joint q/k/v projection ``F.linear(x, weight, bias)`` split into head views q, k, v (b, h, n, d).

    x (b, n, e); weight (3·h·d, e) in the ``(3, h, d)`` row layout. Same values and gradients as
    ``split_heads(F.linear(x, weight, bias), h, d)``; eagerly the backward multiplies each of ∂q, ∂k, ∂v
    with its third of the weight where it lies, instead of first copying the three into one
    (b, n, 3·h·d) gradient (one write and one read of 3 (b, n, e) tensors less, and no such buffer).
    On the accelerator path autograd's linear backward instead: three GEMM-and-copy slices are more
    launches than one stacked gradient.
    Under ``torch.export``, one product per projection with the weight as (h, e, d) heads, broadcast over the
    batch: each lands in the head layout, where one joint GEMM needs a (b, n, 3, h, d) -> (3, b, h, n, d)
    transpose. ONNX Runtime runs the three products faster than the GEMM and the transpose (MiniLM size at
    4K tokens: 12 vs 18 ms at batch 1, 103 vs 182 ms at batch 8).

    ``key_bias_cancels``: the caller uses k only in softmaxes over keys (or over means of keys), where k's
    bias adds the same q·b to every score of a row and cancels. Under ``torch.export`` k then comes
    without it: one (b, h, n, d) addition per layer fewer in the graph (about 1 % of ONNX Runtime's time
    at MiniLM size); the scores differ by rounding only. Elsewhere the bias rides in the GEMM for free.
    """
    if torch.compiler.is_exporting():
        w = weight.view(3, heads, dim_head, -1).transpose(-1, -2)  # (3, h, e, d)
        bb = None if bias is None else bias.view(3, heads, 1, dim_head)  # (3, h, 1, d)
        x4 = x[:, None]  # (b, 1, n, e)
        keep = (True, not key_bias_cancels, True)  # q's, k's and v's bias
        q, k, v = (x4 @ w[i] + bb[i] if bb is not None and keep[i] else x4 @ w[i] for i in range(3))  # (b, h, n, d) each
        return q, k, v
    if torch.compiler.is_compiling() or accelerator_path(x):  # autograd's backward: 5 launches, not 17
        return split_heads(F.linear(x, weight, bias), heads, dim_head)
    if fuses(x, weight, bias):  # inference: oneDNN's GEMM with the bias inside (layers/dense.py)
        return split_heads(dense(x, weight, bias), heads, dim_head)
    return _ProjectHeads.apply(x, weight, bias, heads, dim_head)


def fold_linear_grad(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    dx: torch.Tensor | None,
    *,
    need_x: bool,
    dw: torch.Tensor | None,
    db: torch.Tensor | None,
) -> torch.Tensor | None:
    """One slice of a linear layer's backward, ``t = x · weightᵀ (+ bias)``, folded in where it belongs.

    grad ∂t (b·n, k); x (b·n, e); weight (k, e), the slice's rows, in grad's dtype. Returns ∂x summed
    over the slices so far (``dx + ∂t · W``; ``dx`` None starts the sum; None when ``need_x`` is False).
    Writes ∂W = ∂tᵀ · x into ``dw`` (k, e) and ∂b = Σₙ ∂t into ``db`` (k,) where those are given.
    Shared by the joint projection's backward and ``recompute=True``'s, which fold q, k and v (and there
    group by group) into one ∂x without ever forming the (b·n, 3·k) gradient.
    """
    if need_x:
        dx = grad @ weight if dx is None else dx.addmm_(grad, weight)  # ∂x += ∂t · W_t
    if dw is not None:
        dw.copy_(grad.mT @ x)  # ∂W_t = ∂tᵀ · x
    if db is not None:
        db.copy_(grad.sum(0))
    return dx


class _ProjectHeads(torch.autograd.Function):
    """x -> q, k, v head views of ``F.linear(x, weight, bias)``; see :func:`project_heads`."""

    @staticmethod
    def forward(ctx, x, weight, bias, heads, dim_head):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        qkv = F.linear(x, weight, bias)  # (b, n, 3·h·d)
        parts = qkv.unflatten(-1, (3, heads, dim_head)).permute(2, 0, 3, 1, 4)  # (3, b, h, n, d)
        return parts[0], parts[1], parts[2]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dq, dk, dv):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        b, n, e = x.shape
        hd = weight.shape[0] // 3
        # The forward's compute dtype (autocast's, e.g. bfloat16, or the inputs'): the products run in it,
        # as autograd's would after autocast's casts; the gradients return in the inputs' dtypes.
        dt = next(g for g in (dq, dk, dv) if g is not None).dtype
        x2 = x.reshape(b * n, e).to(dt)
        dw = weight.new_zeros(weight.shape) if need_w else None  # (3·h·d, e)
        db = weight.new_zeros(weight.shape[0]) if need_b and ctx.has_bias else None
        dx = None
        for i, g in enumerate((dq, dk, dv)):
            if g is None:
                continue
            rows = slice(i * hd, (i + 1) * hd)
            g2 = g.transpose(1, 2).reshape(b * n, hd)  # (b·n, h·d): a view when g lies as (b, n, h, d)
            dx = fold_linear_grad(
                g2, x2, weight[rows].to(dt), dx, need_x=need_x,
                dw=None if dw is None else dw[rows], db=None if db is None else db[rows],
            )  # fmt: skip
        if need_x and dx is None:
            dx = x2.new_zeros(b * n, e)
        return None if dx is None else dx.view(b, n, e).to(x.dtype), dw, db, None, None
