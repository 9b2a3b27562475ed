"""Blocks of the packed-documents pages: what a packed row costs against one document (docs/packed_documents.md)
and the lab's packed pre-training rows against padded ones (docs/packing.md).

Data: ``docs/packing/cost.json`` (``python -m nystrom_lab.bench.packing.cost --out docs/packing/cost.json``) and
``docs/packing/bench_packing.json`` (``python -m nystrom_lab.bench.packing ... --out docs/packing``).
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.bench.packing.report import cost_table, render
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_json

COST = "docs/packing/cost.json"
BENCH = "docs/packing/bench_packing.json"


def cost(path: Path) -> str:
    return cost_table(read_json(path)).rstrip("\n")


def bench(path: Path) -> str:
    return render(read_json(path)).rstrip("\n")


BLOCKS = [
    Block("docs/packed_documents.md", "packing-cost", (COST,), cost),
    Block("docs/packing.md", "packing-bench", (BENCH,), bench),
]
