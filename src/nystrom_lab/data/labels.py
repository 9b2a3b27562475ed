"""Labels of a table column as transformers defines them (``problem_type``), and their encoding.

``single_label_classification``: names or integers; class ids in sorted order of the names, integers in
numeric order. ``regression``: one finite float per row. ``multi_label_classification``: a JSON list of
names, or comma-separated names in a CSV/TSV cell (an empty cell: no label). Without an explicit problem
type: lists -> multi-label, integers -> classes, other numbers -> regression, anything else -> names.
Errors are :class:`~nystrom_lab.data.tables.TableError` naming the file, line and column.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from nystrom_lab.data.table_rows import Table, TableError

PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")
_INT = re.compile(r"^[+-]?[0-9]{1,18}$")  # longer digit strings are names, not class numbers


@dataclass(frozen=True)
class LabelSpec:
    """What the labels are: transformers' ``problem_type`` and the class names in id order."""

    problem_type: str
    names: tuple[str, ...] = ()

    @property
    def num_labels(self) -> int:
        return 1 if self.problem_type == "regression" else len(self.names)


#: (file, line, column) of one table cell, for errors
Cell = tuple[Path, int, str]


def _cell(where: Cell, reason: str) -> TableError:
    path, line, column = where
    return TableError(path, f"column {column!r}: {reason}", line=line)


def _name(val: object) -> str:
    return val if isinstance(val, str) else json.dumps(val)


def _multi(val: object, where: Cell) -> list[str]:
    if isinstance(val, list):
        if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in val):
            raise _cell(where, f"a multi-label list must hold names or integers, got {json.dumps(val)[:60]}")
        return [_name(v) for v in val]
    if isinstance(val, str):
        return [p.strip() for p in val.split(",") if p.strip()]
    raise _cell(where, f"expected a list of labels, got {json.dumps(val)[:60]}")


def _float(val: object, where: Cell) -> float:
    try:
        if isinstance(val, bool) or not isinstance(val, (str, int, float)):
            raise ValueError
        out = float(val)
    except (ValueError, OverflowError):
        raise _cell(where, f"expected a number (regression), got {json.dumps(val)[:40]}") from None
    if not math.isfinite(out):
        raise _cell(where, f"the label {val!r} is not a finite number")
    return out


def _is_int(val: object) -> bool:
    return (isinstance(val, int) and not isinstance(val, bool)) or (
        isinstance(val, str) and bool(_INT.match(val))
    )


def infer_labels(table: Table, column: str, problem_type: str | None = None) -> LabelSpec:
    """The :class:`LabelSpec` of a training table's label column (``problem_type`` None: guessed)."""
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise ValueError(f"problem_type must be one of {PROBLEM_TYPES}, got {problem_type!r}")
    vals = table.values(column)
    wheres = [(table.path, line, column) for line in table.lines]
    for val, where in zip(vals, wheres):
        if val is None or (
            isinstance(val, str) and not val.strip() and problem_type != "multi_label_classification"
        ):
            raise _cell(where, "the label is missing")
    if problem_type is None:
        if any(isinstance(v, list) for v in vals):
            problem_type = "multi_label_classification"
        elif vals and all(_is_int(v) for v in vals):
            problem_type = "single_label_classification"
        elif vals and all(not isinstance(v, (bool, list, dict)) and _maybe_float(v) for v in vals):
            problem_type = "regression"
        else:
            problem_type = "single_label_classification"
    if problem_type == "regression":
        for val, where in zip(vals, wheres):
            _float(val, where)
        return LabelSpec(problem_type)
    if problem_type == "multi_label_classification":
        names = {n for val, where in zip(vals, wheres) for n in _multi(val, where)}
    else:
        for val, where in zip(vals, wheres):
            if isinstance(val, (list, dict)):
                raise _cell(where, f"expected one label, got {json.dumps(val)[:60]}")
        names = {_name(v) for v in vals}
    if all(_INT.match(n) for n in names):
        ordered = sorted(names, key=int)  # integer labels keep their meaning: class id 1 is "1"
    else:
        ordered = sorted(names)
    if problem_type == "single_label_classification" and len(ordered) < 2:
        raise TableError(table.path, f"column {column!r} holds one label only ({ordered}); need at least two")
    return LabelSpec(problem_type, tuple(ordered))


def _maybe_float(val: object) -> bool:
    try:
        return math.isfinite(float(val))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return False


def encode_labels(table: Table, column: str, spec: LabelSpec) -> list:
    """Class ids (single-label), floats (regression) or multi-hot float lists (multi-label)."""
    ids = {n: i for i, n in enumerate(spec.names)}
    out: list = []
    for line, val in zip(table.lines, table.values(column)):
        where = (table.path, line, column)
        if spec.problem_type == "regression":
            out.append(_float(val, where))
            continue
        names = _multi(val, where) if spec.problem_type == "multi_label_classification" else [_name(val)]
        unknown = [n for n in names if n not in ids]
        if unknown:
            raise _cell(where, f"label {unknown[0]!r} is not among the training labels {list(spec.names)}")
        if spec.problem_type == "multi_label_classification":
            hot = [0.0] * len(ids)
            for n in names:
                hot[ids[n]] = 1.0
            out.append(hot)
        else:
            out.append(ids[names[0]])
    return out
