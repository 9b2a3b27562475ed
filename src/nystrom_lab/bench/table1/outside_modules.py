"""Table 1's modules from outside our registry: transformers' and lucidrains' Nyström
self-attention, and the TransMIL layer (our lucidrains drop-in as TransMIL's ``TransLayer``).

Legend: b batch, h heads, n tokens, d head dim, e = h·d model width, m landmarks.

Each is wrapped to Table 1's call, ``module(x (b, n, e)) -> (b, n, e)``, with the same q/k/v and output
projections as our modules where the original has them:

- ``hf-nystromformer``: ``transformers``' ``NystromformerSelfAttention`` (m = 64, no conv skip,
  ``segment_means_seq_len`` = n, so n must be a multiple of m) + an output Linear(e, e) (transformers
  puts it in ``NystromformerSelfOutput``, with a LayerNorm and a residual that ours has not);
- ``lucidrains``: ``nystrom_attention.NystromAttention`` (m = 64, 6 pinv iterations, no conv skip), when
  the package imports (:func:`missing` says why not: the GPU image has no network);
- ``transmil``: TransMIL's ``TransLayer``, ``x + NystromAttention(LayerNorm(x))`` with
  :class:`nystrom.compat.lucidrains.NystromAttention` (dim = e, d = 64, h = 8 at Table 1's GPU setting,
  m = 256, 6 pinv iterations, conv skip 33, dropout 0.1: inactive, the modules run in eval mode);
  ``transmil-lucidrains`` the same layer on lucidrains' package.

transformers' and lucidrains' modules run in bf16/fp16 under autocast (:data:`AUTOCAST`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
from torch import nn

from nystrom_lab.bench.comparisons import HFSelfAttention, lucidrains_nystrom_attention

#: registry names of :data:`nystrom_lab.bench.table1.report.METHODS` built here -> the package each needs
NEEDS = {"hf-nystromformer": "transformers", "lucidrains": "nystrom_attention", "transmil": None,
         "transmil-lucidrains": "nystrom_attention"}  # fmt: skip


#: those whose pinv adds a float32 identity (``torch.eye`` without a dtype): cast to bf16/fp16 they raise
#: ("expected scalar type Float but found BFloat16"), so in bf16/fp16 they run as users run them, fp32
#: weights under ``torch.autocast`` (:class:`Autocast`); fp32 tables run them as they are
AUTOCAST = ("hf-nystromformer", "lucidrains", "transmil-lucidrains")


class Autocast(nn.Module):
    """``module(x)`` under ``torch.autocast(device, dtype)``: (b, n, e) -> (b, n, e)."""

    def __init__(self, module: nn.Module, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.module, self.device, self.dtype = module, device, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device, dtype=self.dtype):
            return self.module(x)


def missing(name: str) -> str | None:
    """Why registry name ``name`` cannot be built here (its package does not import), or None."""
    package = NEEDS.get(name)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return f"{package} not importable here (not installed; no network to install it)"


class TransLayer(nn.Module):
    """TransMIL's layer: ``x + attn(norm(x))``, ``attn`` built by ``attention`` with lucidrains'
    ``NystromAttention`` keywords (our drop-in class, or :func:`~nystrom_lab.bench.comparisons.lucidrains_nystrom_attention`)."""

    def __init__(self, attention: Callable[..., nn.Module], e: int, *, heads: int, dim_head: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(e)
        self.attn = attention(dim=e, dim_head=dim_head, heads=heads, num_landmarks=256, pinv_iterations=6,
                              residual=True, dropout=0.1)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


def build(name: str, *, n: int, heads: int, dim_head: int, opts: dict) -> nn.Module:
    """The module of registry name ``name`` (a key of :data:`NEEDS`) for inputs of n tokens."""
    why = missing(name)
    if why:
        raise ImportError(why)
    e = heads * dim_head
    if name == "hf-nystromformer":
        return HFSelfAttention(e, heads=heads, landmarks=opts["num_landmarks"], n=n)
    if name == "lucidrains":
        return lucidrains_nystrom_attention(dim=e, dim_head=dim_head, heads=heads, **opts)
    if name == "transmil":
        from nystrom.compat.lucidrains import NystromAttention as Ours

        return TransLayer(Ours, e, heads=heads, dim_head=dim_head)
    if name == "transmil-lucidrains":
        return TransLayer(lucidrains_nystrom_attention, e, heads=heads, dim_head=dim_head)
    raise ValueError(f"not an external module: {name!r}; choose from {list(NEEDS)}")
