"""What packing costs: a packed row of n tokens against the same n tokens as one document, on this CPU.

Legend: n tokens of the row, D documents in it, m landmarks, h heads, d head dim.

``python -m nystrom_lab.bench.packing.cost [--out docs/packing/cost.json]`` times MiniLM's attention layer
(e = 384, h = 12, d = 32, m = 64, conv 65) at n = 4096 and 16384, forward (no autograd) and
forward + backward, for the row as one document and packed as: Brown's length mix (documents of about
2,600 tokens: one whole and the start of the next, as the long-context rows are cut), 4, 16 and 64
equal documents. All layouts of one n and mode are timed interleaved in one process (a shared VM drifts
within minutes), and each packed time is printed as a ratio to the one-document time of the same run.

The floor: packing adds no token FLOPs when documents have one length (every document is a sample of its
own, :mod:`nystrom.ops.plan.documents`), plus two row gathers; what it must add is one m×m landmark kernel
and pseudo-inverse per document (6 iterations of four m×m products per head: ≈ 50·m³ FLOPs per head and
document), the price of every document having its own landmarks. Unequal documents are padded to the
longest inside the attention (D·L token rows instead of n).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from nystrom import NystromAttention
from nystrom_lab.bench.measure import machine_info
from nystrom_lab.bench.packing.report import COST_LAYOUTS, cost_table

LENGTHS = (4096, 16384)
#: Brown's documents are ≈ 2,600 WordPiece tokens (docs/long-context.md): rows hold one and a part of the next
BROWN_DOCUMENT = 2600


def layouts(n: int) -> dict[str, list[int]]:
    """Document lengths of each layout of an n-token row."""
    brown = [BROWN_DOCUMENT] * (n // BROWN_DOCUMENT)
    brown.append(n - sum(brown)) if n > sum(brown) else None
    out = {"one document": [n], "Brown mix": brown}
    for count in (4, 16, 64):
        out[f"{count} equal"] = [n // count] * count
    assert tuple(out) == COST_LAYOUTS
    return out


def cu_seqlens_of(lengths: list[int]) -> torch.Tensor:
    """Documents of ``lengths`` end to end -> int32 ``cu_seqlens`` (D + 1,), FlashAttention's offsets."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def measure(n: int, *, repeats: int, train: bool) -> dict[str, float]:
    """Median ms per call of every layout at n tokens, interleaved round by round."""
    torch.manual_seed(0)
    layer = NystromAttention(384, heads=12, dim_head=32, conv_kernel_size=65)  # m = 64, the default
    x = torch.randn(1, n, 384, requires_grad=train)
    cases = {name: (None if len(ls) == 1 else cu_seqlens_of(ls)) for name, ls in layouts(n).items()}

    def call(cu: torch.Tensor | None) -> None:
        if train:
            layer(x, cu_seqlens=cu).sum().backward()
        else:
            with torch.no_grad():
                layer(x, cu_seqlens=cu)

    for cu in cases.values():  # warm-up
        call(cu)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, cu in cases.items():
            t0 = time.perf_counter()
            call(cu)
            times[name].append(1e3 * (time.perf_counter() - t0))
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m nystrom_lab.bench.packing.cost", description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="write the record (JSON) and a .md table here")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (median of them)")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    args = parser.parse_args(argv)
    rows = []
    for n in args.lengths:
        for train in (False, True):
            ms = measure(n, repeats=args.repeats, train=train)
            rows.append({"n": n, "mode": "forward + backward" if train else "forward", "ms": ms})
            print(n, rows[-1]["mode"], {k: f"{v:.1f} ({v / ms['one document']:.2f}x)" for k, v in ms.items()})
    record = {"machine": machine_info(), "threads": torch.get_num_threads(), "rows": rows}
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(cost_table(record))
    return record


if __name__ == "__main__":
    main()
