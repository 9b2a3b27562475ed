"""``nystrom::fused_attention``: the whole Nyström attention (and its conv skip) as one ``torch.library`` op.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim, K conv taps, D samples (the
rows, or packed documents), L the longest sample (:class:`.plan.Plan`).

The op's kernel is the Triton forward (:mod:`.forward`, five launches); its autograd formula is the op
``nystrom::fused_attention_backward`` (:mod:`.backward`, four launches and one or two sums). Both have
fake kernels, so ``torch.compile`` traces the op as one opaque node (no graph break) and the meta device
counts it as one op each way. What the backward reads is returned by the forward as non-differentiable
outputs.

Autocast: like SDPA's, the op runs in the autocast dtype: under ``torch.autocast`` float32 q, k, v are
cast to it, and the op runs with autocast off (its inner precisions are chosen: float32 landmarks and
pseudo-inverse, float32 accumulation; the conv weight, in its own dtype, is read as float32).
"""

from __future__ import annotations

import torch

from nystrom.ops.nystrom.fused import backward as _backward
from nystrom.ops.nystrom.fused import forward as _forward
from nystrom.ops.nystrom.fused.launch import check_devices, on_device
from nystrom.utils.amp import autocast_off


@torch.library.custom_op("nystrom::fused_attention", mutates_args=())
def fused_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg: torch.Tensor,
    bounds: torch.Tensor,
    counts: torch.Tensor,
    spans: torch.Tensor,
    length: int,
    conv_weight: torch.Tensor | None,
    scale: float,
    iterations: int,
) -> list[torch.Tensor]:
    """[out (b, h, n, dv), then the backward's tensors] (see :class:`~.forward.Forward`); ``spans`` (D, 3)
    and ``length`` L: the samples; ``conv_weight`` (h, K) or None. The kernels run on q's device and its
    current stream, whichever device is current."""
    device = check_devices(q=q, k=k, v=v, mask=seg, spans=spans, conv_weight=conv_weight)
    with on_device(device):
        return list(_forward.forward(q, k, v, seg, bounds, counts, spans, length, conv_weight, scale, iterations))


@fused_attention_op.register_fake
def _(q, k, v, seg, bounds, counts, spans, length, conv_weight, scale, iterations):
    return list(_forward.outputs(q, v, counts.shape[-1], iterations, spans.shape[0]))


@torch.library.custom_op("nystrom::fused_attention_backward", mutates_args=())
def fused_attention_backward_op(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg: torch.Tensor,
    counts: torch.Tensor,
    spans: torch.Tensor,
    length: int,
    conv_weight: torch.Tensor | None,
    saved: list[torch.Tensor],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv and the conv weight's gradient (h, K) (empty without one) for the gradient ``grad``
    (b, h, n, dv) of the output; ``saved`` is the forward's list. Runs on q's device, as the forward."""
    device = check_devices(q=q, grad=grad, k=k, v=v, mask=seg, spans=spans, conv_weight=conv_weight)
    with on_device(device):
        saved_forward = _forward.Forward(*saved)
        return _backward.backward(grad, q, k, v, seg, counts, spans, length, conv_weight, saved_forward, scale)


@fused_attention_backward_op.register_fake
def _(grad, q, k, v, seg, counts, spans, length, conv_weight, saved, scale):
    b, h, n, d = q.shape
    dw = torch.empty_like(conv_weight) if conv_weight is not None else q.new_empty(0, dtype=torch.float32)
    return (q.new_empty(b, n, h, d).transpose(1, 2), k.new_empty(b, n, h, d).transpose(1, 2),
            v.new_empty(b, n, h, v.shape[-1]).transpose(1, 2), dw)  # fmt: skip


def _setup(ctx, inputs, output) -> None:
    q, k, v, seg, bounds, counts, spans, length, conv_weight, scale, iterations = inputs
    ctx.save_for_backward(q, k, v, seg, counts, spans, conv_weight, *output)
    ctx.scale, ctx.length = scale, length
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # the saved outputs get no gradient: no zero tensors (launches) for them


def _grad(ctx, grads):
    q, k, v, seg, counts, spans, conv_weight, *saved = ctx.saved_tensors
    if grads[0] is None:  # the output took no part in the loss
        return (None,) * 11
    with autocast_off(q.device.type):
        dq, dk, dv, dw = fused_attention_backward_op(
            grads[0], q, k, v, seg, counts, spans, ctx.length, conv_weight, saved, ctx.scale
        )
    return dq, dk, dv, None, None, None, None, None, (dw if conv_weight is not None else None), None, None


fused_attention_op.register_autograd(_grad, setup_context=_setup)


def _autocast_rule(device_type: str):
    key = getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type))

    def rule(_keyset, q, k, v, seg, bounds, counts, spans, length, conv_weight, scale, iterations):
        dtype = torch.get_autocast_dtype(device_type)
        q, k, v = (t.to(dtype) if t.is_floating_point() else t for t in (q, k, v))
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return fused_attention_op(q, k, v, seg, bounds, counts, spans, length, conv_weight, scale, iterations)

    return rule


_LIBRARY = torch.library.Library("nystrom", "IMPL")  # kept alive: the registrations live as long as it
for _device in ("cpu", "cuda"):
    _LIBRARY.impl(
        "fused_attention", _autocast_rule(_device),
        "Autocast" + torch._C._dispatch_key_for_device(_device), with_keyset=True,
    )  # fmt: skip


def fused_attention(
    q, k, v, seg, bounds, counts, spans, length: int, conv_weight, scale: float, iterations: int
) -> torch.Tensor:
    """The op's output (b, h, n, dv)."""
    return fused_attention_op(q, k, v, seg, bounds, counts, spans, length, conv_weight, scale, iterations)[0]
