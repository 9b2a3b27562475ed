"""The transformer feed-forward ``act(x W₁ᵀ + b₁) W₂ᵀ + b₂`` for training, with a blocked backward.

Legend: r rows (batch · tokens), e model width, f FFN width (4e), c rows per block.

Autograd's version keeps two (r, f) tensors per layer for the backward, the pre-activation (for the
activation's derivative) and the activation (for ∂W₂), and its backward writes two more (r, f)
gradients: the largest tensors of a long-input step, each a fresh allocation that page-faults (glibc maps
blocks of ≥ 32 MiB anew) and a full pass through memory. Here only x and the pre-activation are kept; the
forward forms the activation block by block, and the backward walks the rows in blocks of c, recomputing
the block's activation (one activation pass more) while its (c, f) tensors stay in cache:
∂W₂ += ∂yᵀ·a, ∂a = ∂y·W₂, ∂h = ∂a ⊙ act′(h), ∂W₁ += ∂hᵀ·x, ∂x = ∂h·W₁. Same GEMMs; per layer one
(r, f) tensor fewer saved and none of the backward's.

Under autocast the products run in its dtype (bfloat16/float16), as autograd's would after autocast's
casts; weight and bias gradients are summed over blocks in float32 and returned in the parameters' dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from nystrom.utils.amp import autocast_enabled, autocast_off
from nystrom.utils.device import accelerator_path
from nystrom.utils.parallel import range_chunks

#: bytes of (c, f) activations per block
BLOCK_BYTES = 8 << 20
ACTIVATIONS = ("gelu", "gelu_new", "relu")


def _act(name: str, h: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return F.relu(h)
    return F.gelu(h, approximate="tanh" if name == "gelu_new" else "none")


def _act_backward(name: str, grad: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return grad.masked_fill_(h <= 0, 0)
    return torch.ops.aten.gelu_backward(grad, h, approximate="tanh" if name == "gelu_new" else "none")


def row_blocks(x: torch.Tensor, width: int, block_bytes: int) -> list[slice]:
    """Slices of the r rows of ``x`` (r, ·) such that a block's (rows, ``width``) activations in x's dtype
    take at most ``block_bytes`` (at least one row each). On the accelerator path all rows at once: the
    blocks keep CPU caches warm, on a GPU each would be more launches. The FFN's one device question."""
    r = x.shape[0]
    if accelerator_path(x):
        return [slice(0, r)]
    return list(range_chunks(0, r, r, max(1, block_bytes // (width * x.element_size()))))


def _blocks(h: torch.Tensor) -> list[slice]:
    """Row slices of the (r, f) pre-activation ``h``, :data:`BLOCK_BYTES` of it each (:func:`row_blocks`)."""
    return row_blocks(h, h.shape[1], BLOCK_BYTES)


def in_row_blocks(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, width: int, block_bytes: int
) -> torch.Tensor:
    """``fn(x)`` for a row-wise ``fn`` of x (..., e) -> (..., e) whose largest temporaries are (rows,
    ``width``): without autograd, eagerly on CPU, in blocks of :func:`row_blocks` rows written into one
    output (same values; the temporaries of one block stay in cache and are reused); else in one call.
    Returns (..., e) like x."""
    if torch.compiler.is_exporting():
        return _scanned_row_blocks(fn, x, max(1, block_bytes // (width * x.element_size())))
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return fn(x)
    rows = x.reshape(-1, x.shape[-1])  # (r, e)
    blocks = row_blocks(rows, width, block_bytes)
    if len(blocks) == 1:  # the accelerator path, or few rows: no block copies
        return fn(x)
    out = torch.empty_like(rows)
    for block in blocks:
        out[block] = fn(rows[block])  # (c, e)
    return out.view(x.shape)


def _scanned_row_blocks(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, max_rows: int
) -> torch.Tensor:
    """:func:`in_row_blocks` under ``torch.export``: the r rows in ⌈r / max_rows⌉ blocks of c equal rows
    (fewer than one block of zero rows padded at the end) by ``torch.scan``, an ONNX ``Scan`` that ONNX
    Runtime runs block by block. Why: run whole, a long input's (r, f) intermediate and every elementwise
    pass (bias, GELU, residual, LayerNorm) go through memory; in blocks they stay in cache (MiniLM size in
    ORT, 2 cores: 0.94x at 16K tokens, 0.89x at 8 x 4K, level at 4K). A graph keeps no Python branch on r,
    so short inputs run as one block, and pay the padding's and the cut's copies (1.04x at 512 tokens); a
    ``torch.cond`` around it on r would spare them, but torch 2.13's export fails on such a cond in more
    than one layer ("no attribute 'scan_combine_graph_0'"). Returns (..., e) like x."""
    from torch._higher_order_ops.scan import scan

    rows = x.reshape(-1, x.shape[-1])  # (r, e)
    r, e = rows.shape
    blocks = (r + max_rows - 1) // max_rows
    c = (r + blocks - 1) // blocks  # rows per block: at most max_rows, the padding under one block
    padded = F.pad(rows, (0, 0, 0, blocks * c - r)).view(blocks, c, e)  # (blocks, c, e)

    def block(carry: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return carry.clone(), fn(xs)  # the carry is unused: scan requires one

    _, out = scan(block, rows.new_zeros(1), padded)  # (blocks, c, e)
    # cut back as a flat vector: torch.cond (the export's If on every token real) needs strides it can
    # prove dense, and a row slice of the (blocks · c, e) result has a stride symbolic shapes cannot simplify
    return out.reshape(-1)[: r * e].view(x.shape)


class _FeedForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, act, dtype):
        shape = x.shape
        xc = x.reshape(-1, shape[-1]).to(dtype)  # (r, e)
        w1c, w2c = w1.to(dtype), w2.to(dtype)
        h = F.linear(xc, w1c, None if b1 is None else b1.to(dtype))  # (r, f): kept for the backward
        b2c = None if b2 is None else b2.to(dtype)
        blocks = _blocks(h)
        if len(blocks) == 1:  # no block copies: the product is the result
            y = F.linear(_act(act, h), w2c, b2c)  # (r, e)
        else:
            y = xc.new_empty(xc.shape[0], w2.shape[0])  # (r, e)
            for rows in blocks:
                y[rows] = F.linear(_act(act, h[rows]), w2c, b2c)  # (c, e)
        ctx.save_for_backward(xc, h, w1c, w2c)
        ctx.act, ctx.shape = act, shape
        ctx.dtypes = (x.dtype, w1.dtype, None if b1 is None else b1.dtype, w2.dtype, None if b2 is None else b2.dtype)  # fmt: skip
        return y.view(*shape[:-1], w2.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        xc, h, w1c, w2c = ctx.saved_tensors
        tx, tw1, tb1, tw2, tb2 = ctx.dtypes
        need_x, need_w1, need_b1, need_w2, need_b2 = ctx.needs_input_grad[:5]
        acc = torch.promote_types(h.dtype, torch.float32)
        dy = dy.reshape(-1, dy.shape[-1]).to(h.dtype)  # (r, e)
        cast = lambda t, dt: None if t is None else t.to(dt)  # noqa: E731
        if len(_blocks(h)) == 1:
            grads = _one_block_backward(ctx.act, dy, xc, h, w1c, w2c, ctx.needs_input_grad[:5], (tb1, tb2))
            dx, dw1, db1, dw2, db2 = grads
            dx = None if dx is None else dx.view(ctx.shape).to(tx)
            return dx, cast(dw1, tw1), cast(db1, tb1), cast(dw2, tw2), cast(db2, tb2), None, None
        dx = torch.empty_like(xc) if need_x else None
        dw1 = torch.zeros(w1c.shape, dtype=acc, device=h.device) if need_w1 else None  # (f, e)
        dw2 = torch.zeros(w2c.shape, dtype=acc, device=h.device) if need_w2 else None  # (e, f)
        db1 = torch.zeros(h.shape[1], dtype=acc, device=h.device) if need_b1 and tb1 is not None else None
        db2 = torch.zeros(dy.shape[1], dtype=acc, device=h.device) if need_b2 and tb2 is not None else None
        for rows in _blocks(h):
            hb, gy = h[rows], dy[rows]  # (c, f), (c, e)
            if dw2 is not None:
                _add_product(dw2, gy.mT, _act(ctx.act, hb))  # ∂W₂ += ∂yᵀ·a
            if db2 is not None:
                db2.add_(gy.sum(0))
            gh = _act_backward(ctx.act, gy @ w2c, hb)  # (c, f) ∂h = (∂y·W₂) ⊙ act′(h)
            if dw1 is not None:
                _add_product(dw1, gh.mT, xc[rows])  # ∂W₁ += ∂hᵀ·x
            if db1 is not None:
                db1.add_(gh.sum(0))
            if dx is not None:
                torch.mm(gh, w1c, out=dx[rows])  # (c, e)
        dx = None if dx is None else dx.view(ctx.shape).to(tx)
        return dx, cast(dw1, tw1), cast(db1, tb1), cast(dw2, tw2), cast(db2, tb2), None, None


def _one_block_backward(act, dy, xc, h, w1c, w2c, need, bias_dtypes):
    """The backward with all rows in one block (the accelerator path): every gradient is one product or
    sum written directly, none accumulated into a zeroed buffer. Returns ∂x, ∂W₁, ∂b₁, ∂W₂, ∂b₂ (or None)."""
    need_x, need_w1, need_b1, need_w2, need_b2 = need
    tb1, tb2 = bias_dtypes
    dw2 = dy.mT @ _act(act, h) if need_w2 else None  # (e, f) ∂W₂ = ∂yᵀ·a, a recomputed
    db2 = dy.sum(0) if need_b2 and tb2 is not None else None
    gh = _act_backward(act, dy @ w2c, h)  # (r, f) ∂h = (∂y·W₂) ⊙ act′(h)
    dw1 = gh.mT @ xc if need_w1 else None  # (f, e)
    db1 = gh.sum(0) if need_b1 and tb1 is not None else None
    dx = gh @ w1c if need_x else None  # (r, e)
    return dx, dw1, db1, dw2, db2


def _add_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out += a @ b`` with ``out`` the float32 (or float64) sum and a, b maybe half precision."""
    if a.dtype == out.dtype:
        out.addmm_(a, b)
    else:
        out.add_(a @ b)


def feed_forward(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    *,
    activation: str = "gelu",
) -> torch.Tensor:
    """``F.linear(act(F.linear(x, w1, b1)), w2, b2)`` with the memory-lean blocked backward above.

    Args:
        x: (..., e). w1: (f, e), b1: (f,) or None; w2: (e, f), b2: (e,) or None.
        activation: ``"gelu"`` (erf), ``"gelu_new"`` (tanh approximation) or ``"relu"``.

    Returns:
        (..., e), in autocast's dtype under autocast, else x's.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if x.shape[-1] != w1.shape[1] or w2.shape[1] != w1.shape[0]:
        raise ValueError(
            f"shapes do not chain: x (..., {x.shape[-1]}), w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
        )
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if autocast_enabled(device) else x.dtype
    with autocast_off(device):
        return _FeedForward.apply(x, w1, b1, w2, b2, activation, dtype)
