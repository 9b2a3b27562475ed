"""Nyström attention's entry point: the checks, then the op's ONE choice of implementation.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, dv value dim.

Four implementations compute the same function (the formula is in :mod:`.naive`, the reference):

* ``fused`` (CUDA with Triton, and the meta device): the whole attention as one op, five Triton kernels
  forward and five backward, for the calls :func:`~nystrom.ops.nystrom.fused.covers` takes (any other
  call runs one of the three below);
* ``cpu`` (eager on the CPU): the landmark kernel on one thread, the two large products through the
  cache-blocked, threaded kernels of :mod:`.cpu_kernels`;
* ``accelerator`` (eager on a GPU or the meta device, or CPU tensors inside ``force_accelerator_path()``):
  the same maths as few and large launches;
* ``traceable`` (under ``torch.compile``/``torch.export``, on any device): plain ops and SDPA, which the
  compiler can follow.

:func:`nystrom_attention` is the only place that chooses between them; the modules, models and drop-ins
call it and ask no device question of their own.
"""

from __future__ import annotations

import torch

from nystrom.ops.conv import add_conv_skip, conv_taps
from nystrom.ops.nystrom import accelerator, cpu, fused, traceable
from nystrom.ops.nystrom.options import check_options
from nystrom.ops.plan import is_packed, padding, run_packed
from nystrom.utils.amp import autocast_off
from nystrom.utils.checks import first_order_only, rejects_key_padding_mask, zero_padding
from nystrom.utils.device import accelerator_path


def _eager() -> bool:
    """Whether to run the eager implementations (threads, custom autograd, custom ops): not while
    torch.compile or torch.export trace, which cannot follow the CPU kernels; ``traceable`` computes the
    same function there."""
    return not torch.compiler.is_compiling()


@rejects_key_padding_mask
def nystrom_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_landmarks: int = 64,
    mask: torch.Tensor | None = None,
    pinv_iterations: int = 6,
    pinv: str = "iterative",
    pinv_init: str = "per_matrix",
    segments: str = "balanced",
    scale: float | None = None,
    causal: bool = False,
    padded_finite: bool = False,
    conv_weight: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """Nyström self-attention, O(n·d + m²) memory.

    Args:
        q, k: (b, h, n, d); v: (b, h, n, dv). float16/bfloat16/float32/float64, one dtype.
        num_landmarks: m. With m ≥ n (and ``pinv="exact"``) the result is exact softmax attention.
        mask: bool (b, n), True = real token. Padded tokens enter neither landmarks nor keys, and may
            hold any values (NaN and Inf included): no real output or gradient depends on them. Their
            own output rows are unspecified (finite).
        pinv_iterations: iterations of the Razavi et al. method.
        pinv: ``"iterative"`` (the paper) or ``"exact"`` (``torch.linalg.pinv``).
        pinv_init: ``"per_matrix"`` or ``"original"`` (batch-wide Z₀, for parity with public code only).
        segments: ``"balanced"`` (real token of rank r of L goes to landmark ⌊r·m/L⌋) or
            ``"front_padded"`` (lucidrains' layout: runs of ⌈n/m⌉ positions after virtual front padding).
        scale: score scale, default 1/√d.
        causal: must be False; Nyström landmarks are bidirectional (raises if True).
        padded_finite: the caller guarantees that padded positions of q, k, v hold finite values (the
            modules' projections of zeroed inputs do), so they need not be zeroed: a padded key's
            probability is an exact 0, and 0 times a finite value is 0 (saves three passes, or on a GPU
            four launches, per call).
        conv_weight: the Nyströmformer's skip connection, added to the output: the depthwise convolution
            of v over the tokens (``nn.Conv2d(h, h, (K, 1), padding=(K // 2, 0), groups=h, bias=False)``'s
            weight (h, 1, K, 1), or (h, K); K odd), padded tokens read as 0. The fused kernels add it in
            their query pass; the other paths add ``ops.conv``'s skip.
        cu_seqlens: packed documents, FlashAttention's layout: int32 (documents + 1,) offsets into the
            b·n tokens read row after row (0, the end of each document, ..., b·n; every row starts a
            document). Each document attends only to itself, with its own m landmarks by the same
            segment rule (and its own conv skip): its rows are what it gets alone, on every path. The
            mask may still mark padding inside documents. See :mod:`nystrom.ops.plan.documents`.
        max_seqlen: with ``cu_seqlens``, the longest document's length if known (FlashAttention's
            ``max_seqlen``; transformers passes it as ``max_length_q``): saves a host read per call, and
            under ``torch.compile`` keeps documents from being padded to the row length.

    Returns:
        (b, h, n, dv) in the inputs' dtype. Landmarks, A and A⁺ are computed in ≥ float32.
    """
    mask, scale = check_options(
        q, k, v, num_landmarks, mask, pinv_iterations, pinv, pinv_init, segments, scale, causal
    )
    packed = is_packed(cu_seqlens, max_seqlen)
    if packed and segments != "balanced":
        raise ValueError(
            f"segments={segments!r} (lucidrains' layout) places landmarks by the row's length, so packed "
            "documents padded to a common length would not get their own landmarks; pack with "
            "segments='balanced' (the default), or run the documents one by one"
        )
    if packed and pinv_init != "per_matrix":
        raise ValueError(
            f"pinv_init={pinv_init!r} scales the pseudo-inverse's start by the whole batch (the public "
            "codes' parity mode), so a packed document's answer would depend on its neighbours; pack with "
            "pinv_init='per_matrix' (the default)"
        )
    # packed documents too: each a sample of the kernels, in its own span of its row (one call's launches)
    if fused.covers(q, v, num_landmarks=num_landmarks, pinv=pinv, pinv_init=pinv_init):
        taps = None if conv_weight is None else conv_taps(v, conv_weight)  # (h, K)
        with autocast_off(q.device.type):  # the op runs in the inputs' dtype
            out = fused.fused_attention(
                q,
                k,
                v,
                num_landmarks=num_landmarks,
                mask=mask,
                pinv_iterations=pinv_iterations,
                segments=segments,
                scale=scale,
                conv_taps=taps,
                cu_seqlens=cu_seqlens,
                max_seqlen=max_seqlen,
            )  # fmt: skip  (padded positions are never read: no zeroing needed)
        return first_order_only(out, "nystrom_attention")
    if packed:  # every document as a sample of its own: exact on every path below

        def attend(qd: torch.Tensor, kd: torch.Tensor, vd: torch.Tensor, md: torch.Tensor) -> torch.Tensor:
            # Documents of at most L ≤ m tokens have every token as a landmark of its own, and the unused
            # landmarks drop out exactly (an identity block of A): L landmarks give the same answer as m,
            # for an L×L pseudo-inverse per document instead of m×m.
            return nystrom_attention(
                qd, kd, vd, num_landmarks=min(num_landmarks, qd.shape[2]), mask=md, pinv_iterations=pinv_iterations, pinv=pinv,
                pinv_init=pinv_init, segments=segments, scale=scale, padded_finite=padded_finite,
                conv_weight=conv_weight,
            )  # fmt: skip

        return run_packed(attend, q, k, v, mask=mask, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
    # the conv skip reads padded v as 0: zeroed below unless padded_finite, then here for the conv alone
    conv_v = None
    if conv_weight is not None and padded_finite and mask is not None:
        conv_v = v.masked_fill(padding(mask)[:, None, :, None], 0)
    q, k, v = zero_padding(mask, q, k, v, padded_finite=padded_finite)
    if not _eager():
        path = traceable
    elif accelerator_path(q):  # few large launches instead of the CPU's blocked kernels
        path = accelerator
    else:
        path = cpu
    with autocast_off(q.device.type):  # dtypes inside are chosen on purpose
        out = path.nystrom_core(
            q, k, v, num_landmarks=num_landmarks, mask=mask, pinv_iterations=pinv_iterations, pinv=pinv,
            pinv_init=pinv_init, segments=segments, scale=scale,
        )  # fmt: skip
    if conv_weight is not None:
        out = add_conv_skip(out, v if conv_v is None else conv_v, conv_weight)
    return first_order_only(out, "nystrom_attention")
