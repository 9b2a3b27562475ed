"""argparse value types shared by every command (one definition, one error wording)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An int ≥ 1."""
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A float > 0."""
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from err
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def positive_ints(text: str) -> list[int]:
    """Comma-separated ints ≥ 1, at least one."""
    try:
        vals = [int(t) for t in text.split(",") if t]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals
