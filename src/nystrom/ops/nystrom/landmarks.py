"""Segment-means landmarks that respect padding and any sequence length.

Legend: b batch, h heads, n tokens, m landmarks, d head dim, L real tokens of one sample.

Landmark j of a sample is the mean of its real tokens whose rank r among the sample's L real tokens
satisfies floor(r·m/L) = j. With no padding and m | n this is exactly the paper's contiguous
segment-means; n need not divide by m; padding never enters a landmark; when L ≤ m every real token is
its own landmark and the landmarks no token maps to are reported as invalid in the landmark mask.

The assignment depends on the mask only, so a model computes it once per forward for all its layers:
inside :func:`~nystrom.ops.plan.shared_plan` (``Encoder.forward`` opens it) every call with that very
mask object reuses what the first one computed (on a GPU it is a dozen launches per layer otherwise).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from nystrom.ops.pinv import exact_pinv, iterative_pinv
from nystrom.ops.plan import shared
from nystrom.utils.checks import (
    check_choice,
    check_finite,
    check_mask,
    check_positive_int,
    rejects_key_padding_mask,
)

SEGMENTS = ("balanced", "front_padded")

#: set by :func:`every_landmark_used`; a module global, not a ContextVar: TorchDynamo, which traces the
#: branches of ``torch.cond``, reads a global (as a constant) but cannot call a ContextVar
_every_landmark_used = False


@contextlib.contextmanager
def every_landmark_used() -> Iterator[None]:
    """Inside, under ``torch.export``, calls without a mask report no landmark mask (valid None): every
    balanced landmark holds a token, which is true when n ≥ m. The caller guarantees n ≥ m for every
    layer, e.g. by a graph branch on it (:class:`~nystrom.convert.onnx_graph.ExportedForward`). Why: an
    exported graph cannot know n ≥ m from n, so it would otherwise add the landmarks' validity bias to the
    (b, h, n, m) scores of every layer (1.5 % of ONNX Runtime's time at 4K tokens, MiniLM size). Eagerly,
    and with a mask, nothing changes. Not thread-safe (an export runs in one thread)."""
    global _every_landmark_used
    before, _every_landmark_used = _every_landmark_used, True
    try:
        yield
    finally:
        _every_landmark_used = before


def _known_used(n: int, m: int, mask: torch.Tensor | None, segments: str) -> bool:
    """Whether every landmark holds a token, known without looking at values: no mask, balanced segments
    (front-padded runs leave the first ones empty when m does not divide n), and n ≥ m, known from n
    eagerly and under ``torch.export`` only inside :func:`every_landmark_used`."""
    if mask is not None or segments != "balanced":
        return False
    if torch.compiler.is_exporting():
        return _every_landmark_used
    return n >= m


def landmark_assignment(
    mask: torch.Tensor | None,
    b: int,
    n: int,
    m: int,
    device: torch.device,
    *,
    segments: str = "balanced",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Map every token to its landmark.

    ``segments="balanced"``: the real token of rank r (of L) goes to landmark ⌊r·m/L⌋.
    ``segments="front_padded"`` (lucidrains' layout): the positions, virtually padded at the front to
    m·l with l = ⌈n/m⌉, are cut into m runs of l; a real token goes to its run's landmark.

    Returns ``seg`` (b, n) int64 with values in [0, m] (m = padding, belongs to no landmark) and
    ``counts`` (b, m) int64, the number of real tokens in each landmark.
    """
    if mask is None:
        real = torch.ones(b, n, dtype=torch.bool, device=device)
    else:
        real = mask
    if segments == "front_padded":
        run = (n + m - 1) // m  # l = ⌈n/m⌉ (not -(-n // m): torch.onnx writes // as Div, which truncates negatives)
        pos = torch.arange(n, device=device) + (m * run - n)  # (n,) position after the front padding
        seg = torch.where(real, pos // run, m)  # (b, n)
    else:
        length = real.sum(-1, keepdim=True).clamp(min=1)  # (b, 1) = L; ≥ 1: unchecked rows (traced, GPU)
        rank = real.long().cumsum(-1) - 1  # (b, n) rank among real tokens
        seg = torch.where(real, (rank * m) // length, m)  # (b, n) floor(r·m/L), exact in integers
    counts = torch.zeros(b, m + 1, dtype=torch.long, device=device)
    counts.scatter_add_(1, seg, torch.ones_like(seg))
    return seg, counts[:, :m]


def _runs_of(n: int, m: int, mask: torch.Tensor | None) -> bool:
    """Whether the m segments are contiguous runs of n/m tokens, known from n alone (no mask, m divides n).
    Never under ``torch.export``: an exported graph keeps no Python branch on n, so it takes the general
    path, which gives the same segments, for every n."""
    return mask is None and n % m == 0 and not torch.compiler.is_exporting()


def _segment_means(
    x: torch.Tensor, m: int, mask: torch.Tensor | None, acc_dtype: torch.dtype, segments: str = "balanced"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Unchecked core of :func:`segment_means`; sums in ``acc_dtype``. Returns (b, h, m, d) and (b, m), or
    None for the landmark mask under ``torch.export`` inside :func:`every_landmark_used`."""
    b, h, n, d = x.shape
    if _runs_of(n, m, mask):
        # The paper's contiguous segments: a free view and one reduction, no index traffic. Reducing in
        # token-major order reads whole (h·d) rows of a head view (measured 1.4x faster than head-major).
        tokens = x.transpose(1, 2).unflatten(1, (m, n // m))  # (b, m, l, h, d)
        means = tokens.mean(2, dtype=acc_dtype).transpose(1, 2)  # (b, h, m, d)
        return means, torch.ones(b, m, dtype=torch.bool, device=x.device)
    index, divisor, valid = shared(
        mask,
        ("rows", b, n, m, segments, acc_dtype, x.device),
        lambda: _row_plan(mask, b, n, m, x.device, segments, acc_dtype),
    )
    if torch.compiler.is_exporting() and _known_used(n, m, mask, segments):
        valid = None  # (the eager CPU path keeps its (b, m) mask: its kernels take one)
    # Rows of (b·n, h·d) are contiguous runs for both (b, h, n, d) tensors and head views of a joint
    # (b, n, 3, h, d) projection, so this reshape is usually a view. It is a strided one for the head
    # views, and index_add_ then falls back to a scatter_add_ over an expanded index: copying first is 3x
    # faster (0.39 vs 1.18 ms at (2600, 384) rows; the padded and packed CPU calls take this path).
    rows = x.permute(0, 2, 1, 3).reshape(b * n, h * d).to(acc_dtype).contiguous()  # (b·n, h·d)
    sums = rows.new_zeros(b * (m + 1), h * d).index_add_(0, index, rows)  # (b·(m+1), h·d)
    sums = sums.view(b, m + 1, h, d)[:, :m].permute(0, 2, 1, 3)  # (b, h, m, d)
    return sums / divisor, valid  # empty landmarks stay 0


def _row_plan(mask, b, n, m, device, segments, acc_dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """index (b·n,) of every token's row in (b·(m+1)) sums, divisor (b, 1, m, 1) and valid (b, m)."""
    seg, counts = landmark_assignment(mask, b, n, m, device, segments=segments)
    index = (seg + torch.arange(b, device=device)[:, None] * (m + 1)).reshape(-1)  # (b·n,)
    return index, counts.clamp(min=1).to(acc_dtype)[:, None, :, None], counts > 0


def averaging_weights(
    mask: torch.Tensor | None,
    b: int,
    n: int,
    m: int,
    device: torch.device,
    *,
    segments: str,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The segment means as a product: ``W`` (b, m, n) with ``W @ x_rows`` the landmarks, and valid (b, m)
    (None when every landmark is known to be used without looking at values: :func:`_known_used`).

    Row j of W holds 1/count_j at the real tokens of landmark j and 0 elsewhere. Why a product on the
    accelerator path: one GEMM per tensor for any mask, instead of a zeroed buffer, an index_add_ and a
    division; W is m·n floats per sample, computed once per forward (:func:`~nystrom.ops.plan.shared_plan`).
    """
    if _runs_of(n, m, mask):  # contiguous runs of n/m tokens: a banded W, no index arithmetic
        seg = torch.arange(n, device=device) // (n // m)  # (n,)
        w = (seg == torch.arange(m, device=device)[:, None]).to(dtype).div_(n // m)  # (m, n)
        return w.expand(b, m, n), None
    seg, counts = landmark_assignment(mask, b, n, m, device, segments=segments)  # (b, n), (b, m)
    onehot = (
        seg[:, None, :] == torch.arange(m, device=device)[None, :, None]
    )  # (b, m, n); padding (m) nowhere
    w = onehot.to(dtype) / counts.clamp(min=1).to(dtype)[:, :, None]  # (b, m, n)
    return w, (None if _known_used(n, m, mask, segments) else counts > 0)


@rejects_key_padding_mask
def segment_means(
    x: torch.Tensor, num_landmarks: int, mask: torch.Tensor | None = None, *, segments: str = "balanced"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Segment-means landmarks of ``x``.

    Args:
        x: (b, h, n, d) queries or keys.
        num_landmarks: m ≥ 1.
        mask: optional bool (b, n), True = real token.
        segments: ``"balanced"`` or ``"front_padded"`` (lucidrains' layout), see :func:`landmark_assignment`.

    Returns:
        ``(landmarks, landmark_mask)``: (b, h, m, d) in ``x``'s dtype (means accumulated in float32 for
        half-precision inputs) and bool (b, m), False for landmarks that no real token maps to.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must have shape (batch, heads, tokens, head_dim), got {shape}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    m = check_positive_int("num_landmarks", num_landmarks)
    check_choice("segments", segments, SEGMENTS)
    mask = check_mask(mask, x.shape[0], x.shape[2], x.device)
    acc = torch.promote_types(x.dtype, torch.float32)
    means, lmask = _segment_means(x, m, mask, acc, segments)
    return means.to(x.dtype), lmask


def landmark_means(q, k, m, mask, segments) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Q̃, K̃ (b, h, m, d) in ≥ float32 and valid (b, m) from q, k (b, h, n, d) with zeroed padding (valid
    None: every landmark used, see :func:`every_landmark_used`)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    q_l, valid = _segment_means(q, m, mask, acc, segments)  # (b, h, m, d), (b, m)
    k_l, _ = _segment_means(k, m, mask, acc, segments)  # (b, h, m, d)
    # Landmarks are means of real tokens only, so this sees exactly the real positions (cheap: (m, d)).
    check_finite("q at a real (unpadded) token", q_l)
    check_finite("k at a real (unpadded) token", k_l)
    return q_l, k_l, valid


def landmark_kernel_pinv(q_l, k_l, valid, scale, pinv_iterations, pinv, pinv_init) -> torch.Tensor:
    """A⁺ (b, h, m, m) of A = softmax(Q̃ K̃ᵀ s), with an identity block on the invalid landmarks (valid
    (b, m), or None: all valid)."""
    m = q_l.shape[-2]
    scores = q_l @ k_l.mT * scale  # (b, h, m, m)
    if valid is not None:
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    a = torch.softmax(scores, -1)  # (b, h, m, m)
    if valid is not None:
        pair = valid[:, None, :, None] & valid[:, None, None, :]  # (b, 1, m, m)
        a = torch.where(pair, a, torch.eye(m, dtype=a.dtype, device=a.device))  # identity block on invalid
    return iterative_pinv(a, pinv_iterations, pinv_init) if pinv == "iterative" else exact_pinv(a)
