"""Readers of the committed data files the docs are rendered from (standard library only: rendering must
not wait for torch, so the test that compares docs with data stays fast); training logs are read by
:func:`nystrom_lab.data.records.read_metrics`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from nystrom_lab.data.records import read_metrics


def _value(text: str) -> int | float | str:
    """A CSV cell as the benchmark wrote it: an int, a float, or text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_csv(path: Path) -> list[dict]:
    """Rows of a benchmark CSV; empty cells are left out, as the benchmark's rows left out what a case
    did not produce (a skipped case has no ``ms``, a good one no ``error``)."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        return [{k: _value(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def read_json(path: Path) -> dict:
    """A JSON data file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def dev_records(path: Path) -> list[dict]:
    """The dev evaluations of a training log, in step order."""
    return [r for r in read_metrics(path) if r.get("split") == "dev"]


def percent(x: float, digits: int = 1) -> str:
    """A fraction as a percentage with ``digits`` decimals, e.g. ``13.8 %``."""
    return f"{100 * x:.{digits}f} %"
