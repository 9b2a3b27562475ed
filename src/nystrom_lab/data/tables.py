"""The user's own labelled files: CSV, TSV and JSON Lines tables for fine-tuning and prediction.

Formats (by suffix, or ``fmt``): ``.csv`` (RFC 4180: comma-separated, ``"``-quoted fields may hold commas
and newlines), ``.tsv``/``.tab`` (tab-separated; quotes are text, as in GLUE's files), ``.jsonl``/
``.ndjson``/``.json`` (one JSON object per line). CSV/TSV start with a header line; a UTF-8 BOM is
ignored. Blank lines are skipped.

Labels (transformers' ``problem_type``; :mod:`nystrom_lab.data.labels`): ``single_label_classification`` (names or integers; class ids
in sorted order of the names, integers numerically), ``regression`` (one float per row) and
``multi_label_classification`` (a JSON list of names, or comma-separated names in a CSV/TSV cell).
Without an explicit problem type: lists -> multi-label, integers -> classes, other numbers ->
regression, anything else -> class names.

Every problem in a file is a :class:`TableError` (a :class:`~nystrom_lab.data.DataFileError`, as every
reader raises) naming the file, the line and, where one is involved, the column; a missing file is
``FileNotFoundError``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from nystrom_lab.data.glue import Examples
from nystrom_lab.data.labels import PROBLEM_TYPES, LabelSpec, encode_labels, infer_labels
from nystrom_lab.data.table_rows import Table, TableError

__all__ = ["FORMATS", "PROBLEM_TYPES", "LabelSpec", "Table", "TableError", "encode_labels", "infer_labels",
           "read_table", "table_examples"]  # fmt: skip

FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
}


def table_format(path: Path, fmt: str | None = None) -> str:
    if fmt is not None:
        if fmt not in FORMATS.values():
            raise TableError(path, f"format must be csv, tsv or jsonl, got {fmt!r}")
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise TableError(
            path, f"cannot tell the format from the suffix {suffix!r}; use one of {sorted(FORMATS)}"
        )
    return FORMATS[suffix]


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        col = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise TableError(
            path, f"not UTF-8 text ({err.reason} at byte {col} of the line)", line=line
        ) from None


def _read_delimited(path: Path, text: str, delimiter: str) -> Table:
    csv.field_size_limit(1 << 26)
    quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    rows: list[dict[str, object]] = []
    lines: list[int] = []
    header: list[str] | None = None
    start = 1
    try:
        for fields in reader:
            line, start = start, reader.line_num + 1
            if not fields or fields == [""]:
                continue  # a blank line
            if header is None:
                header = fields
                _check_header(path, line, header)
                continue
            if len(fields) != len(header):
                sep = "comma" if delimiter == "," else "tab"
                raise TableError(
                    path,
                    f"expected {len(header)} {sep}-separated fields ({', '.join(header)}), got {len(fields)}",
                    line=line,
                )
            rows.append(dict(zip(header, fields)))
            lines.append(line)
    except csv.Error as err:
        raise TableError(
            path, f"malformed {('CSV' if delimiter == ',' else 'TSV')} ({err})", line=reader.line_num
        ) from None
    if header is None:
        raise TableError(path, "the file is empty (expected a header line naming the columns)", line=1)
    if not rows:
        raise TableError(path, "no examples after the header (an empty split)")
    return Table(path, tuple(header), rows, lines)


def _check_header(path: Path, line: int, header: list[str]) -> None:
    for i, name in enumerate(header):
        if not name.strip():
            raise TableError(path, f"column {i + 1} of the header has no name", line=line)
    dup = sorted({n for n in header if header.count(n) > 1})
    if dup:
        raise TableError(path, f"the header names column(s) {dup} more than once", line=line)


def _read_jsonl(path: Path, text: str) -> Table:
    rows: list[dict[str, object]] = []
    lines: list[int] = []
    columns: dict[str, None] = {}
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            raise TableError(
                path, f"not valid JSON ({err.msg} at character {err.colno})", line=line
            ) from None
        except (ValueError, RecursionError) as err:  # > 4300-digit integers, absurd nesting
            raise TableError(
                path, f"not usable JSON ({type(err).__name__}: {str(err)[:80]})", line=line
            ) from None
        if not isinstance(obj, dict):
            raise TableError(path, f"expected a JSON object per line, got {type(obj).__name__}", line=line)
        rows.append(obj)
        lines.append(line)
        columns.update(dict.fromkeys(obj))
    if not rows:
        raise TableError(path, "the file holds no JSON objects")
    return Table(path, tuple(columns), rows, lines)


def read_table(path: str | os.PathLike[str], *, fmt: str | None = None) -> Table:
    """Read a CSV, TSV or JSONL file (format from the suffix unless ``fmt``)."""
    path = Path(path)
    kind = table_format(path, fmt)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    text = _decode(path, path.read_bytes())
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise TableError(path, "NUL byte: this is not a text table", line=line)
    if kind == "jsonl":
        return _read_jsonl(path, text)
    return _read_delimited(path, text, "," if kind == "csv" else "\t")


def table_examples(
    table: Table,
    *,
    text_column: str,
    text_pair_column: str | None = None,
    label_column: str | None = None,
    labels: LabelSpec | None = None,
    name: str = "table",
) -> Examples:
    """The fine-tuning :class:`~nystrom_lab.data.glue.Examples` of a table (unlabelled when ``labels`` is None
    or the table lacks the label column, as a test file may). ``index`` is the row number from 0."""
    labelled = labels is not None and label_column is not None and label_column in table.columns
    text_a = table.texts(text_column)
    text_b = table.texts(text_pair_column) if text_pair_column else None
    for i, line in enumerate(table.lines):
        if not (text_a[i].strip() or (text_b is not None and text_b[i].strip())):
            cols = [c for c in (text_column, text_pair_column) if c]
            raise TableError(table.path, f"empty example: no text in column(s) {cols}", line=line)
    return Examples(
        name=name,
        index=[str(i) for i in range(len(table.rows))],
        text_a=text_a,
        text_b=text_b,
        labels=encode_labels(table, label_column, labels) if labelled else None,
        label_names=labels.names if labels is not None else (),
    )
