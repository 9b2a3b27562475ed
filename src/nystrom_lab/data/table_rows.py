"""The rows of one user table file and its error type, shared by the readers (:mod:`nystrom_lab.data.tables`)
and the label logic (:mod:`nystrom_lab.data.labels`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nystrom_lab.data.file_checks import DataFileError


class TableError(DataFileError):
    """A table file that cannot be used: ``"<path> line <line>: column '<name>': <reason>"``."""


@dataclass
class Table:
    """Rows of one file: ``rows[i]`` maps column -> value (str for CSV/TSV, any JSON value for JSONL)
    and was read from line ``lines[i]`` (1-based; the first line of a multi-line CSV record)."""

    path: Path
    columns: tuple[str, ...]
    rows: list[dict[str, object]]
    lines: list[int]

    def require(self, *columns: str | None) -> None:
        """Fail unless every named column (None: not asked for) is there; the error lists the columns there are."""
        for column in columns:
            if column is not None and column not in self.columns:
                raise TableError(self.path, f"no column {column!r}; the columns are {list(self.columns)}")

    def values(self, column: str) -> list[object]:
        """The column's value in every row; an absent column lists the columns there are."""
        self.require(column)
        out = []
        for row, line in zip(self.rows, self.lines):
            if column not in row:  # JSONL rows may lack a key other rows have
                raise TableError(
                    self.path, f"column {column!r}: missing (this row has {sorted(row)})", line=line
                )
            out.append(row[column])
        return out

    def texts(self, column: str) -> list[str]:
        """The column as text (a JSON value must be a string)."""
        out = []
        for line, val in zip(self.lines, self.values(column)):
            if not isinstance(val, str):
                raise TableError(
                    self.path,
                    f"column {column!r}: expected text, got {json.dumps(val)[:40]} ({type(val).__name__})",
                    line=line,
                )
            try:
                val.encode("utf-8")
            except UnicodeEncodeError as err:  # a lone surrogate escape in JSON ("\ud800")
                raise TableError(
                    self.path, f"column {column!r}: invalid text ({err.reason})", line=line
                ) from None
            out.append(val)
        return out
