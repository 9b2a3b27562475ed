"""Memory-lean softmax attention kernels for the two Nyström products (CPU-tuned, exact).

Legend: b batch, h heads, n tokens, m landmarks (few), d head dim, dv value dim, c chunk length.

``short_key_attention``: softmax(q k̃ᵀ·s) w with n queries and m ≪ n keys (F · A⁺BV). Every softmax
row is complete inside a chunk of queries, so chunks are independent and the backward recomputes
each chunk's probabilities from the inputs (nothing (n, m) is saved).

``long_key_attention``: softmax(q̃ kᵀ·s) v with m queries and n keys (B · V). The keys stream in chunks
with an online softmax (running max and sum, as in flash attention); the backward recomputes each
chunk from the saved log-sum-exp.

Work items are (sample, range of rows) for the short-key kernel and (sample, range of keys) for the
long-key kernel (split-K, merged by their log-sum-exp), forward and backward. Each item runs on one
thread (see ``utils/parallel.py``) and steps through its range in cache-sized chunks with all heads batched,
reads q/k/v through their strides (head views of a joint q/k/v projection need no copy) and writes results
into heads-interleaved buffers, so no (n, m) or (m, n) matrix is ever alive, forward or backward.
Masked keys get probability exactly 0 via ``masked_fill`` (so any finite garbage at padding is inert).
Scores are in base 2 and exponentiated without a row max when every row sum stays in [2⁻⁶⁴, 2⁶⁴]
(softmax is shift-invariant); otherwise the chunk (short-key) or the call (long-key) is redone with it.
On other devices, and below ``*_MIN_N`` tokens on CPU (``TRAIN_MIN_N`` when autograd records a
gradient), the same maths runs through PyTorch's ``scaled_dot_product_attention`` (flash attention:
O(n) memory too, and faster for short sequences and in training).

The recomputing backward passes are in ``cpu_kernels_backward.py``; the tunables above (``CHUNK_*``,
``SPLITS``) and the probability routine are read here and handed to them, so setting them on this
module changes forward and backward alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nystrom.ops.nystrom.cpu_kernels_backward import long_key_backward, short_key_backward
from nystrom.utils.memory import empty
from nystrom.utils.parallel import parallel_for, range_chunks

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x·log2 e)
CHUNK_ROWS = 1024  # query rows per step in short_key_attention, all heads at once (h·c·m floats)
CHUNK_KEYS = 1024  # keys per step in long_key_attention, all heads at once (h·c·(m + 2d) floats)
SPLITS: int | None = None  # row/key ranges per sample (one work item each); None = enough for every thread
# Below these lengths PyTorch's SDPA kernel (also O(n) memory: flash attention on CPU) is faster than the
# chunk loops; measured on the 2-core VM, b·h = 8: level at 16384, SDPA 25 vs 37 ms for the core at 8192.
SHORT_MIN_N = 16384
LONG_MIN_N = 16384
# With a gradient to record, the switch moves up: SDPA's flash backward beats ours by more than our
# forward beats its forward. Module fwd+bwd (e = 512, h = 8, m = 64, 2-core AMD EPYC, interleaved A/B in
# one run), chunked vs SDPA ms: n = 8192 356/314, 16384 781/690, 24576 1175/1069, 32768 1480/1437,
# 65536 2905/2829, 131072 6435/6409 (level; same peak memory); TransMIL (m = 256, conv 33) 6000 536/477,
# 20000 1576/1548. Above this length training takes the chunked kernels and their recomputing backward.
TRAIN_MIN_N = 131072
UNSHIFTED_MIN, UNSHIFTED_MAX = 2.0**-64, 2.0**64  # row sums for which unshifted exp2 is safe (_probs2)


def _softmax2_(s: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """In-place softmax over the last dim of base-2 scores (..., m); ``valid`` (m,) masks keys.

    Base 2 (exp2 of log2(e)-scaled scores) instead of ``torch.softmax``: on this CPU exp2 runs
    3.7x faster than exp, and the four passes stay in cache; the short-key kernel measured 106 → 92 ms
    at n = 65536 (median of 12, same process).
    """
    if valid is not None:
        s.masked_fill_(~valid, float("-inf"))
    s.sub_(s.amax(-1, keepdim=True)).exp2_()  # every row has a valid key, so its max is finite
    return s.div_(s.sum(-1, keepdim=True))


def _sums_in_range(tot: torch.Tensor) -> bool:
    """Whether every sum of unshifted exp2 terms is in [2⁻⁶⁴, 2⁶⁴] (so no term overflowed, and the
    largest term of each row is a normal float: the softmax is as accurate as the max-shifted one)."""
    if tot.numel() == 0:  # batch 0: nothing to check
        return True
    lo, hi = torch.aminmax(tot)
    return bool(lo >= UNSHIFTED_MIN) and bool(hi <= UNSHIFTED_MAX)


def _probs2(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """softmax(a @ b) over the last dim for base-2 scores, computed into ``out`` (h, c, m).

    Why unshifted first: softmax is shift-invariant, and for scores within ±64 (base 2; any sane
    attention) exp2 needs no max subtraction, which saves the row-max and subtraction passes (measured
    ≈ 8 ms per kernel per thread at n = 65536). A chunk with a row sum outside the safe range is
    recomputed with the max shift (the slow path is exact too, and tested).
    """
    s = torch.bmm(a, b, out=out)
    if valid is not None:
        s.masked_fill_(~valid, float("-inf"))
    tot = s.exp2_().sum(-1, keepdim=True)  # (h, c, 1)
    if _sums_in_range(tot):
        return s.div_(tot)
    return _softmax2_(torch.bmm(a, b, out=out), valid)


def _splits(b: int) -> int:
    """Ranges (of rows or keys) per sample: enough (sample, range) work items to feed every thread."""
    return max(1, -(-torch.get_num_threads() // max(b, 1))) if SPLITS is None else SPLITS  # b = 0: no items


class _ShortKeyAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, valid, scale):
        b, h, n, _ = q.shape
        out = empty(b, n, h, v.shape[-1], like=q)  # heads interleaved: the caller's head merge is a view
        kt = (k * (scale * LOG2E)).mT.contiguous()  # (b, h, d, m) base-2 scores

        r_ = _splits(b)
        span = -(-n // r_)

        # Items are (sample, row range) with all heads batched (one bmm per step, not one mm per head;
        # measured 88 → 80 ms at n = 65536), so the workers also first-touch disjoint pages of the fresh
        # output. One score buffer per item: in isolation a bmm into a fresh 2 MiB result ran at 38 instead
        # of 89 GFLOP/s (allocation and page faults); inside this loop the A/B was level.
        def item(t: int) -> None:
            i, r = divmod(t, r_)
            vi = None if valid is None else valid[i]
            buf = q.new_empty(h, min(CHUNK_ROWS, span), kt.shape[-1])
            for rows in range_chunks(r, span, n, CHUNK_ROWS):
                p = _probs2(q[i, :, rows], kt[i], buf[:, : rows.stop - rows.start], vi)  # (h, c, m)
                torch.bmm(p, v[i], out=out[i, rows].transpose(0, 1))  # (h, c, dv) into the interleaved output

        parallel_for(item, range(b * r_), device=q.device)
        ctx.save_for_backward(q, k, v, valid)
        ctx.scale = scale
        return out.permute(0, 2, 1, 3)  # (b, h, n, dv) view

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, valid = ctx.saved_tensors
        kt = (k * (ctx.scale * LOG2E)).mT.contiguous()  # (b, h, d, m) base-2 scores, as in the forward
        r_, s = _splits(q.shape[0]), ctx.scale  # tunables read here, where they are set: see kernels_backward
        grads = short_key_backward(
            grad_out, q, k, kt, v, valid, scale=s, splits=r_, chunk=CHUNK_ROWS, probs=_probs2
        )
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:3])), None, None)


def _long_forward(
    qs: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, *, shifted: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(qs kᵀ) v over base-2 scores; returns out (b, h, m, dv) and log2-sum-exp2 (b, h, m, 1).

    Split-K over key ranges, all heads of a key chunk at once (flash-decoding): one item streams a
    token-major slab of k and v (every head of the same rows, not one head's 1/h of each row), with one
    batched op per step instead of one per head (measured 86 → 78 ms at n = 65536 on head views of a
    joint q/k/v projection). Each range keeps its own running max/sum; merged below. ``shifted=False`` skips
    the running max (exp2 of the raw scores, see ``_probs2``); the caller checks the sums.
    """
    b, h, m, _ = qs.shape
    n, dv = k.shape[2], v.shape[-1]
    r_ = _splits(b)
    acc = qs.new_zeros(b, r_, h, m, dv)
    mxs = qs.new_full((b, r_, h, m, 1), float("-inf") if shifted else 0.0)  # running max (0: unshifted)
    tots = qs.new_zeros(b, r_, h, m, 1)  # running sum of exp2(score − max)
    span = -(-n // r_)

    def item(t: int) -> None:
        i, r = divmod(t, r_)
        a, mx, tot = acc[i, r], mxs[i, r], tots[i, r]  # (h, m, dv), (h, m, 1), (h, m, 1)
        buf = qs.new_empty(h, m, min(CHUNK_KEYS, span))
        for keys in range_chunks(r, span, n, CHUNK_KEYS):
            if key_mask is not None:
                mc = key_mask[i, keys]  # (c,)
                if not bool(mc.any()):
                    continue
            sc = torch.bmm(qs[i], k[i, :, keys].mT, out=buf[:, :, : keys.stop - keys.start])  # (h, m, c)
            if key_mask is not None:
                sc.masked_fill_(~mc, float("-inf"))
            if not shifted:
                tot.add_(sc.exp2_().sum(-1, keepdim=True))
                a.baddbmm_(sc, v[i, :, keys])  # (h, m, dv)
                continue
            new = torch.maximum(mx, sc.amax(-1, keepdim=True))  # (h, m, 1)
            sc.sub_(new).exp2_()
            corr = (mx - new).exp2_()  # rescales what the earlier chunks accumulated
            tot.mul_(corr).add_(sc.sum(-1, keepdim=True))
            a.mul_(corr).baddbmm_(sc, v[i, :, keys])  # (h, m, dv)
            mx.copy_(new)

    parallel_for(item, range(b * r_), device=qs.device)
    top = mxs.amax(1, keepdim=True)  # (b, 1, h, m, 1): finite, every row has a real key
    w = (mxs - top).exp2_()  # (b, r, h, m, 1); 0 for a range without real keys
    tot = (tots * w).sum(1)  # (b, h, m, 1)
    out = (acc * w).sum(1).div_(tot)  # (b, h, m, dv)
    return out, top[:, 0] + tot.log2()  # log2-sum-exp2 of the base-2 scores


class _LongKeyAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_mask, scale):
        # Scores in base 2 (log2 e folded into the queries): torch.exp2 measured 3.7x faster than torch.exp
        # on this CPU (float32), and the exponential is a third of this loop's time.
        qs = (q * (scale * LOG2E)).contiguous()  # (b, h, m, d)
        out, lse = _long_forward(qs, k, v, key_mask, shifted=False)
        if not (_sums_in_range(lse.exp2()) and bool(torch.isfinite(out).all())):
            out, lse = _long_forward(qs, k, v, key_mask, shifted=True)  # a score beyond ±64: redo exactly
        ctx.save_for_backward(qs, k, v, key_mask, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        qs, k, v, key_mask, out, lse = ctx.saved_tensors  # base-2 queries and log-sum-exp
        qn = qs * (1.0 / LOG2E)  # (b, h, m, d) = q·scale, the natural-unit queries ∂s/∂k needs
        r_, s = _splits(qs.shape[0]), ctx.scale
        dq, dk, dv = long_key_backward(
            grad_out, qs, qn, k, v, key_mask, out, lse, scale=s, splits=r_, chunk=CHUNK_KEYS
        )
        return dq, dk, dv, None, None


_HALF = (torch.float16, torch.bfloat16)


def _row_unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _chunked(n: int, min_n: int, *tensors: torch.Tensor) -> bool:
    """Whether a CPU call of ``n`` tokens takes the chunked kernels (see ``SHORT_MIN_N``, ``TRAIN_MIN_N``)."""
    training = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return n >= (TRAIN_MIN_N if training else min_n)


def short_key_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, valid: torch.Tensor | None = None, scale: float
) -> torch.Tensor:
    """``softmax(q kᵀ·scale) v`` over few keys.

    Args:
        q: (b, h, n, d) queries (any strides).
        k: (b, h, m, d) keys; v: (b, h, m, dv) values; m small.
        valid: optional bool (b, m); False keys get probability 0 (every row needs one True).
        scale: multiplier of the scores.

    Returns:
        (b, h, n, dv); on CPU a view of a contiguous (b, n, h, dv) buffer.
    """
    if q.device.type != "cpu" or not _chunked(q.shape[2], SHORT_MIN_N, q, k, v):
        mask = None if valid is None else valid[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if q.dtype in _HALF:  # CPU: accumulate softmax sums in float32; the result returns in q's dtype
        return short_key_attention(q.float(), k.float(), v.float(), valid=valid, scale=scale).to(q.dtype)
    return _ShortKeyAttention.apply(_row_unit_stride(q), k.contiguous(), v.contiguous(), valid, float(scale))


def long_key_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, key_mask: torch.Tensor | None = None, scale: float
) -> torch.Tensor:
    """``softmax(q kᵀ·scale) v`` for few queries over many keys, streamed with an online softmax.

    Args:
        q: (b, h, m, d) queries, m small.
        k: (b, h, n, d) keys; v: (b, h, n, dv) values (any strides).
        key_mask: optional bool (b, n), True = real key (every row needs one).
        scale: multiplier of the scores.

    Returns:
        (b, h, m, dv).
    """
    if q.device.type != "cpu" or not _chunked(k.shape[2], LONG_MIN_N, q, k, v):
        mask = None if key_mask is None else key_mask[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if q.dtype in _HALF:  # CPU: the online softmax's running sums need float32
        return long_key_attention(q.float(), k.float(), v.float(), key_mask=key_mask, scale=scale).to(q.dtype)
    return _LongKeyAttention.apply(q, _row_unit_stride(k), _row_unit_stride(v), key_mask, float(scale))
