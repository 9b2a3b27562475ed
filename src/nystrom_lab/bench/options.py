"""The option helpers the ``nystrom bench`` and ``nystrom approx`` commands share."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TypeVar

from nystrom_lab.argtypes import output_dir

T = TypeVar("T")

# default output folders: never docs/ (a quick run must not overwrite the committed tables; `--out docs` does)
BENCH_OUT = Path("runs/bench")


def or_default(value: T | None, default: T) -> T:
    """The option's value, or the suite's default when the option was not given (None)."""
    return default if value is None else value


def names(text: str) -> tuple[str, ...]:
    """The non-empty items of a comma-separated option."""
    return tuple(t for t in text.split(",") if t)


def command_line() -> str:
    """The command line this process was started with, as ``nystrom ...``."""
    return "nystrom " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def add_output_options(p: argparse.ArgumentParser, default: Path) -> None:
    """``--out`` (``default``: under runs/, never docs/) and ``--no-markdown`` of a benchmark command."""
    p.add_argument(
        "--out", type=output_dir, default=default,
        help=f"folder for CSV/markdown/PNG and benchmarks.md (default {default}; --out docs updates the"
        " committed tables)",
    )  # fmt: skip
    p.add_argument("--no-markdown", action="store_true", help="do not update OUT/benchmarks.md")
