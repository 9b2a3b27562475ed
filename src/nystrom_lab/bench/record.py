"""How a bench leaves its result: the command line that reproduces it, and OUT/<stem>.json + OUT/<stem>.md."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path


def command_line(module: str, argv: list[str] | None) -> str:
    """``python -m module args...`` as the user typed it (``argv`` None: this process's own arguments)."""
    return " ".join([f"python -m {module}", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])


def write_record(out: Path, stem: str, res: dict, table: str) -> None:
    """Write ``res`` to OUT/<stem>.json and ``table`` to OUT/<stem>.md (OUT created), and print the table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(table)
    print(table, end="")
