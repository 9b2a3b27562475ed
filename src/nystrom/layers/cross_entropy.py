"""Linear layer + cross-entropy fused, a block of rows at a time (the MLM head's vocabulary projection).

Legend: k rows (masked tokens), e hidden size, v vocabulary, c rows per block.

``F.cross_entropy(F.linear(x, W, bias), target)`` holds the (k, v) logits, their log-softmax and, in the
backward, their gradient: three (k, v) float32 tensors (at k = 2,458 masked tokens of a 4 × 4096 batch
and v = 30,522, 300 MB each), each written and read in full passes, each a fresh allocation that
page-faults. Here the rows go through in blocks of c, and the block's gradient is formed in the forward
while its logits are in cache: the loss is a *weighted sum* ``Σ_i w_i · ce_i`` whose per-row weights
``w`` are known up front (e.g. 1 / (batch · masked tokens of the row's example) for a mean of
per-example means), so ∂logits_i = w_i · (softmax_i − onehot_i) needs nothing from the backward except
the scalar upstream gradient. The backward only scales ∂x, ∂W, ∂bias. Same GEMMs (one forward, two
backward), no (k, v) tensor alive beyond a block. (Liger-Kernel's fused linear cross-entropy does the
same on GPUs.)

Accuracy: logits are accumulated and normalised in float32 whatever the compute dtype (autocast's
bfloat16/float16 run the three GEMMs in that dtype, as autograd would after autocast's casts); ∂W and
∂bias are summed over blocks in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nystrom.utils.amp import autocast_enabled, autocast_off
from nystrom.utils.checks import value_checks_enabled
from nystrom.utils.parallel import range_chunks

#: logits per block, c · v float32 values (16 MiB): under glibc's 32 MiB mmap ceiling, so the block buffers
#: are reused from the heap instead of page-faulting in each block
BLOCK_BYTES = 16 << 20


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, target, row_weight, dtype):
        k, v = x.shape[0], weight.shape[0]
        grads = ctx.needs_input_grad[:3]
        xc, wc = x.to(dtype), weight.to(dtype)  # the compute dtype (autocast's, or the inputs')
        bc = None if bias is None else bias.to(dtype)
        acc = row_weight.dtype  # softmax and sums: float32 (float64 stays), chosen by the caller
        losses = torch.empty(k, dtype=acc, device=x.device)
        preds = torch.empty(k, dtype=torch.long, device=x.device)
        # The gradient products run before any loss scaling (GradScaler multiplies in the backward), so
        # in float16 small gradients would underflow: they run in float32 there; bfloat16 has float32's range.
        gdt = acc if dtype == torch.float16 else dtype
        xg, wg = (xc, wc) if gdt == dtype else (x.to(gdt), weight.to(gdt))
        dx = torch.empty(x.shape, dtype=gdt, device=x.device) if grads[0] else None  # (k, e)
        dw = torch.zeros(weight.shape, dtype=acc, device=x.device) if grads[1] else None  # (v, e)
        db = torch.zeros(v, dtype=acc, device=x.device) if grads[2] and bias is not None else None
        for rows in range_chunks(0, k, k, max(1, BLOCK_BYTES // (acc.itemsize * v))):
            t = target[rows]  # (c,)
            logits = F.linear(xc[rows], wc, bc).to(acc)  # (c, v)
            lse = torch.logsumexp(logits, -1)  # (c,)
            losses[rows] = lse - logits.gather(1, t[:, None])[:, 0]
            preds[rows] = logits.argmax(-1)
            if not any(grads):
                continue
            g = logits.sub_(lse[:, None]).exp_()  # softmax, in place: (c, v)
            g[torch.arange(len(t), device=g.device), t] -= 1.0
            g.mul_(row_weight[rows, None])  # ∂loss/∂logits
            if db is not None:
                db.add_(g.sum(0))
            gc = g.to(gdt)
            if dx is not None:
                dx[rows] = gc @ wg  # (c, e)
            if dw is not None and gdt == acc:
                dw.addmm_(gc.mT, xg[rows])  # (v, e)
            elif dw is not None:  # a bfloat16 product per block, summed in float32
                dw.add_(gc.mT @ xg[rows])  # (v, e)
        ctx.save_for_backward(dx, dw, db)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(losses, preds)
        return (losses * row_weight).sum(), losses, preds

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad, _losses, _preds):
        dx, dw, db = ctx.saved_tensors
        tx, tw, tb = ctx.dtypes
        scale = lambda t, dt: None if t is None else (t * grad.to(t.dtype)).to(dt)  # noqa: E731
        return scale(dx, tx), scale(dw, tw), scale(db, tb), None, None, None


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    row_weight: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Σ_i row_weight_i · cross_entropy(x_i Wᵀ + bias, target_i)`` without holding the (k, v) logits.

    Args:
        x: (k, e) rows (e.g. the MLM head's transformed hidden states at the masked positions).
        weight: (v, e) the output projection (e.g. tied to the word embeddings); bias: (v,) or None.
        target: (k,) class indices in [0, v) (no ignore index: select the rows first).
        row_weight: (k,) float weights of the rows in the loss (not differentiated).

    Returns:
        ``(loss, token_loss, prediction)``: the weighted sum (a scalar, differentiable in x, weight and
        bias), each row's cross-entropy (k,) and its argmax class (k,) (both detached); losses are float32
        (float64 for float64 inputs).
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"x must be (k, e) and weight (v, e) with the same e, got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    k, v = x.shape[0], weight.shape[0]
    if target.shape != (k,) or row_weight.shape != (k,):
        raise ValueError(
            f"target and row_weight must be ({k},), got {tuple(target.shape)} and {tuple(row_weight.shape)}"
        )
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"target must hold class indices (int64/int32), got {target.dtype}")
    if value_checks_enabled(target) and k and (int(target.min()) < 0 or int(target.max()) >= v):
        raise ValueError(
            f"target must lie in [0, {v}), got values in [{int(target.min())}, {int(target.max())}]"
        )
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if autocast_enabled(device) else x.dtype
    with autocast_off(device):
        acc = torch.promote_types(dtype, torch.float32)  # the loss's dtype, carried by the row weights
        return _LinearCrossEntropy.apply(x, weight, bias, target.long(), row_weight.detach().to(acc), dtype)
