"""The measurement of the approximation study: its inputs, each method's output, its relative error.

Legend: h heads, n tokens, d head dim, e = h·d model width, m budget (see below), r latent rank,
N tokens of the whole text.

Protocol: every method gets the *same* q, k, v (1, h, n, d) through its functional form (no output
projection, so the error is the attention's own), and the error is ``‖Ŷ − Y‖_F / ‖Y‖_F`` over all heads,
the mean over ``trials`` draws of the method's randomness. The budget m is chosen so a query touches
about m keys or key summaries:

- ``nystrom``: m segment-means landmarks, 6-iteration pinv (the paper); ``nystrom-exact-pinv``: ``torch.linalg.pinv``.
- ``linformer``: m projected keys; E, F as :class:`~nystrom.attention.LinformerAttention` initialises
  them (untrained — nothing is trained here, so this is Linformer's random-projection regime);
  ``linformer-pool``: E = F = mean pooling over m contiguous segments, the best-behaved untrained choice
  (attention over segment-mean keys and values).
- ``longformer``: window m + 1 centred on the query.
- ``performer``: m orthogonal random features (FAVOR+).
- ``reformer``: 2 hash rounds, bucket size m/2 (a query sees its chunk and the previous: m keys a round).
  Reformer attends with shared QK by design, so its reference is exact *shared-QK* attention (keys = the
  normalised queries, self logit −5e4): its error measures the LSH approximation only.
- ``uniform``: the mean of v for every query — the error of knowing nothing about the scores; a method
  near it has captured no structure (v's common mean makes any averaging look fairly good).

Inputs (not i.i.d. noise): ``minilm`` — q, k, v of layer ``layer`` of all-MiniLM-L6-v2 (h=12, d=32) on
the CPython LICENSE text: hidden states are computed in 512-token windows ([CLS] … [SEP], the model's
position limit), concatenated, and the layer's own q/k/v projection is applied, so for n > 512 the
attention spans windows. ``lowrank`` — per head q, k, v = (Z Aₓ + σ·E)·g with Z (n, r) Gaussian
latents shared by q, k and v, Aₓ (r, d), noise σ, and a gain g that sets the logits' spread.

The study itself (lengths, outputs, report) is :mod:`nystrom_lab.bench.approx.driver`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from nystrom.attention import LinformerAttention
from nystrom.functional import nystrom_attention, softmax_attention
from nystrom.ops.baselines.linformer import linformer_attention
from nystrom.ops.baselines.longformer import sliding_window_attention
from nystrom.ops.baselines.performer import orthogonal_random_features, performer_attention
from nystrom.ops.baselines.reformer import SELF_LOGIT, lsh_attention, lsh_num_buckets, random_rotations

METHODS = (
    "nystrom",
    "nystrom-exact-pinv",
    "linformer",
    "linformer-pool",
    "longformer",
    "performer",
    "reformer",
    "uniform",
)
PARAMS = (8, 16, 32, 64, 128, 256)
WINDOW = 512  # MiniLM's position limit


def default_text() -> Path:
    """The CPython licence (≈ 3.3k MiniLM tokens of English) next to the ``os`` module."""
    return Path(os.__file__).parent / "LICENSE.txt"


@torch.no_grad()
def minilm_qkv(*, layer: int, text: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (1, 12, N, 32) of MiniLM layer ``layer`` over the whole text (512-token windows, concatenated)."""
    import tokenizers

    from nystrom.model import from_bert, minilm_path

    if not text.is_file():
        raise FileNotFoundError(f"--text {text}: no such file")
    folder = minilm_path()
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    ids = tok.encode(text.read_text(), add_special_tokens=False).ids
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    model = from_bert(folder, attention="softmax").base_model
    layers = model.encoder.layers
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer must be in [0, {len(layers)}), got {layer}")
    attn = layers[layer].attention
    seen: list[torch.Tensor] = []
    hook = attn.register_forward_pre_hook(lambda _mod, args: seen.append(args[0]))
    try:
        body = WINDOW - 2
        for i in range(0, len(ids), body):
            model.encode(torch.tensor([[cls_id, *ids[i : i + body], sep_id]]))
    finally:
        hook.remove()
    x = torch.cat(seen, dim=1)  # (1, N, e): the layer's input over all windows
    qkv = attn.qkv(x).unflatten(-1, (3, attn.heads, attn.dim_head))  # (1, N, 3, h, d)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (1, h, N, d)
    return q.contiguous(), k.contiguous(), v.contiguous()


def lowrank_qkv(
    n: int,
    *,
    heads: int = 4,
    dim_head: int = 64,
    rank: int = 8,
    noise: float = 0.3,
    gain: float = 1.5,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthetic low-rank-plus-noise q, k, v, each (1, heads, n, dim_head)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(1, heads, n, rank, generator=g)  # (1, h, n, r) latents shared by q, k and v

    def one() -> torch.Tensor:
        a = torch.randn(heads, rank, dim_head, generator=g) / math.sqrt(rank)  # (h, r, d)
        return (z @ a + noise * torch.randn(1, heads, n, dim_head, generator=g)) * gain  # (1, h, n, d)

    return one(), one(), one()


def shared_qk_attention(qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exact shared-QK attention (Reformer's target): keys = normalised queries, self logit −5e4. (1, h, n, d)."""
    logits = qk @ F.normalize(qk, dim=-1).mT / math.sqrt(qk.shape[-1])  # (b, h, n, n)
    logits.diagonal(dim1=-2, dim2=-1).fill_(SELF_LOGIT)
    return torch.softmax(logits, -1) @ v  # (b, h, n, d)


def approximate(
    method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: int, *, seed: int
) -> torch.Tensor:
    """Output (b, h, n, d) of ``method`` with budget m on q, k (b, h, n, d), v (b, h, n, d)."""
    h, n, d = q.shape[1], q.shape[2], q.shape[3]
    g = torch.Generator().manual_seed(seed)
    if method in ("nystrom", "nystrom-exact-pinv"):
        pinv = "exact" if method == "nystrom-exact-pinv" else "iterative"
        return nystrom_attention(q, k, v, num_landmarks=m, pinv=pinv)
    if method == "linformer":
        torch.manual_seed(seed)  # the module's own initialisation draws from the global RNG
        mod = LinformerAttention(h * d, heads=h, dim_head=d, max_seq_len=n, proj_len=m)
        return linformer_attention(q, k, v, mod.e.detach(), mod.f.detach())
    if method == "linformer-pool":
        seg = torch.arange(n) * m // n  # (n,) segment of each token
        pool = F.one_hot(seg, m).T.to(q.dtype)  # (m, n)
        pool = pool / pool.sum(1, keepdim=True)
        return linformer_attention(q, k, v, pool, pool)
    if method == "longformer":
        return sliding_window_attention(q, k, v, window_size=m + 1 - m % 2)
    if method == "performer":
        return performer_attention(q, k, v, orthogonal_random_features(m, d, generator=g))
    if method == "reformer":
        c = max(1, m // 2)
        rot = random_rotations(2, d, lsh_num_buckets(n, c), generator=g)
        return lsh_attention(q, v, rot, bucket_size=c)
    if method == "uniform":
        return v.mean(dim=2, keepdim=True).expand_as(v)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """‖approx − exact‖_F / ‖exact‖_F over every element."""
    return float((approx.double() - exact.double()).norm() / exact.double().norm())


@torch.no_grad()
def sweep(
    family: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    methods: tuple[str, ...] = METHODS,
    params: tuple[int, ...] = PARAMS,
    trials: int = 3,
    seed: int = 0,
) -> list[dict]:
    """Rows {family, n, method, param, rel_err, rel_err_std, reference, logit_std} for q, k, v (1, h, n, d)."""
    n = q.shape[2]
    exact = softmax_attention(q, k, v)  # (1, h, n, d)
    shared = shared_qk_attention(q, v) if "reformer" in methods else None
    logit_std = float((q[..., :512, :] @ k[..., :512, :].mT / math.sqrt(q.shape[-1])).std())
    rows = []
    for method in methods:
        budgets = (0,) if method == "uniform" else tuple(p for p in params if p <= n)
        deterministic = method in ("nystrom", "nystrom-exact-pinv", "linformer-pool", "longformer", "uniform")
        for m in budgets:
            ref = shared if method == "reformer" else exact
            errs = torch.tensor(
                [
                    relative_error(approximate(method, q, k, v, m, seed=seed + t), ref)
                    for t in range(1 if deterministic else trials)
                ]
            )
            rows.append(
                {
                    "family": family,
                    "n": n,
                    "method": method,
                    "param": m,
                    "rel_err": float(errs.mean()),
                    "rel_err_std": float(errs.std()) if len(errs) > 1 else 0.0,
                    "reference": "shared-QK softmax" if method == "reformer" else "softmax",
                    "logit_std": logit_std,
                }
            )
    return rows
