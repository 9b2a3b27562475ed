"""Every rendered block of the docs: which doc, which marker name, which committed data files, which render.

One list, so ``nystrom docs render`` and ``nystrom docs check`` (and the test that runs the check) see the
same blocks, and a reader can look up what any measured table rests on.
"""

from __future__ import annotations

from nystrom_lab.docs import (
    blocks_bench,
    blocks_cpu,
    blocks_gpu,
    blocks_gpu_text,
    blocks_launches,
    blocks_models,
    blocks_packing,
    blocks_results,
    blocks_text,
)
from nystrom_lab.docs.block import Block

BLOCKS: list[Block] = [
    *blocks_bench.BLOCKS,
    *blocks_cpu.BLOCKS,
    *blocks_gpu.BLOCKS,
    *blocks_gpu_text.BLOCKS,
    *blocks_launches.BLOCKS,
    *blocks_models.BLOCKS,
    *blocks_packing.BLOCKS,
    *blocks_results.BLOCKS,
    *blocks_text.BLOCKS,
]
