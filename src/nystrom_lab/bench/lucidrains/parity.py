"""How far nystrom.compat.lucidrains is from lucidrains' nystrom-attention where lucidrains is not exact.

Run: ``python -m nystrom_lab.bench.lucidrains`` (needs ``nystrom-attention``; about a minute on 2 cores).
TransMIL's layer (dim 512, 8 heads × 64, m = 256, residual conv 33), batch 1, copied weights, eval mode.
Prints a Markdown table of cosine similarities (over all outputs) and max relative row errors (with a path
argument also writes the rows as JSON there: docs/lucidrains_parity.json is what ``nystrom docs render``
makes docs/lucidrains.md's table of):

- ours vs lucidrains without a mask (what a user switching imports sees), with our default
  ``pinv_init="original"`` and with ``"per_matrix"``;
- lucidrains with an all-True mask vs without (its own exact maths vs its padded one), and ours vs
  lucidrains with that mask;
- each against exact softmax attention (+ the same conv skip): which one approximates better.

Settings: "random" = PyTorch's default init and x ~ N(0, 1) (near-uniform attention); "trained-like" =
x drawn around 32 cluster centres (patch features of a few tissue types) and q/k weights scaled ×3 so
scores spread over several units (as in a trained model); "peaked" = the same with ×8 (very sharp
attention, where six pinv iterations are far from converged).
"""

from __future__ import annotations

import inspect
import json
import platform
from pathlib import Path

import torch
import torch.nn.functional as F

from nystrom.compat.lucidrains import NystromAttention
from nystrom_lab.bench.comparisons import lucidrains_nystrom_attention
from nystrom_lab.bench.lucidrains.report import render

LENGTHS = (6000, 6144, 10000)
#: theirs runs as many Newton–Schulz iterations as ours does by default (the one definition)
PINV_ITERATIONS = inspect.signature(NystromAttention).parameters["pinv_iterations"].default


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def _row_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()


def _inputs(setting: str, n: int, gen: torch.Generator) -> torch.Tensor:
    if setting == "random":  # the others: clustered patch features
        return torch.randn(1, n, 512, generator=gen)
    centres = torch.randn(32, 512, generator=gen)
    pick = torch.randint(0, 32, (n,), generator=gen)
    return (centres[pick] + 0.5 * torch.randn(n, 512, generator=gen))[None]


def _softmax_reference(mod, x: torch.Tensor) -> torch.Tensor:
    """Exact softmax attention with the module's weights and conv skip: (1, n, 512)."""
    q, k, v = mod.to_qkv(x).unflatten(-1, (3, mod.heads, -1)).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(q, k, v) + mod.res_conv(v)
    return mod.to_out(o.transpose(1, 2).flatten(2))


@torch.no_grad()
def main(out: Path | None = None) -> None:
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, threads {torch.get_num_threads()}"
    )
    rows = []
    for setting, qk_gain in (("random", 1.0), ("trained-like", 3.0), ("peaked", 8.0)):
        gen = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        theirs = lucidrains_nystrom_attention(
            dim=512, dim_head=64, heads=8, num_landmarks=256, pinv_iterations=PINV_ITERATIONS, residual=True
        ).eval()
        theirs.to_qkv.weight[:1024] *= qk_gain  # q and k rows: sharper attention
        ours = NystromAttention(512, dim_head=64, heads=8, num_landmarks=256).eval()
        ours.load_state_dict(theirs.state_dict(), strict=True)
        per_matrix = NystromAttention(
            512, dim_head=64, heads=8, num_landmarks=256, pinv_init="per_matrix"
        ).eval()
        per_matrix.load_state_dict(theirs.state_dict(), strict=True)
        for n in LENGTHS:
            x = _inputs(setting, n, gen)
            all_real = torch.ones(1, n, dtype=torch.bool)
            t_plain, t_mask = theirs(x), theirs(x, mask=all_real)
            o = ours(x)
            exact = _softmax_reference(theirs, x)
            rows.append({"setting": setting, "n": n, "ours_vs_theirs": _cos(o, t_plain),
                         "per_matrix_vs_theirs": _cos(per_matrix(x), t_plain),
                         "theirs_masked_vs_unmasked": _cos(t_mask, t_plain), "ours_vs_theirs_masked": _cos(o, t_mask),
                         "theirs_vs_exact": _cos(t_plain, exact), "ours_vs_exact": _cos(o, exact),
                         "worst_row_err": _row_err(o, t_plain)})  # fmt: skip
    print(render(rows))
    if out is not None:
        source = f"python -m nystrom_lab.bench.lucidrains, torch {torch.__version__}"
        out.write_text(json.dumps({"source": source, "rows": rows}, indent=1) + "\n")

