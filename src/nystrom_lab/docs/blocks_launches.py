"""Blocks of docs/gpu/launches.md (issue #36): ops dispatched per forward and forward + backward on the
meta device, ours vs transformers' Nyströmformer, before and after the launch work.

Data: ``docs/gpu/launches_before.json`` (``nystrom bench launches --out …`` on the code before the work)
and ``docs/gpu/launches.json`` (the same command on the code now).
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.bench.launches_report import before_after, render
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_json

DOC = "docs/gpu/launches.md"
BEFORE = "docs/gpu/launches_before.json"
AFTER = "docs/gpu/launches.json"


def report(path: Path) -> str:
    """A run's own report (what ``nystrom bench launches`` prints and writes)."""
    return render(read_json(path)).rstrip("\n")


def compare(before: Path, after: Path) -> str:
    """Our ops before and after, and after ÷ HF."""
    return before_after(read_json(before), read_json(after))


BLOCKS = [
    Block(DOC, "launches-before-after", (BEFORE, AFTER), compare),
    Block(DOC, "launches-after", (AFTER,), report),
    Block(DOC, "launches-before", (BEFORE,), report),
]
