"""The one error type for bad data files, and the checks every reader shares.

Trust boundary: a data file (a TSV, a review, a pickle, a PNG, a metadata or tokenizer file) may come from
anywhere, so a reader never runs code from it, never follows a path in it out of its folder, never
allocates what it merely declares, and reports anything it cannot use as :class:`DataFileError` naming
the file and, for line-based formats, the 1-based line. A missing file or folder stays
``FileNotFoundError``. See docs/reliability.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath


class DataFileError(ValueError):
    """A data file that exists but cannot be used (malformed, undecodable, empty, a bad label, ...).

    ``str(err)`` is ``"<path> line <line>: <reason>"`` (or ``"<path>: <reason>"`` when no line applies).
    Attributes: ``path`` (:class:`~pathlib.Path`), ``line`` (1-based ``int`` or ``None``), ``reason``.
    A subclass of ``ValueError``, so ``except ValueError`` keeps working.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str, *, line: int | None = None) -> None:
        self.path = Path(path)
        self.line = line
        self.reason = reason
        where = str(self.path) if line is None else f"{self.path} line {line}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):  # keyword-only ``line``: picklable across worker processes
        return _rebuild, (self.path, self.reason, self.line)


def _rebuild(path: Path, reason: str, line: int | None) -> DataFileError:
    return DataFileError(path, reason, line=line)


def decode_utf8(raw: bytes, path: Path, line: int) -> str:
    """``raw`` (one line) as UTF-8 text, or :class:`DataFileError` naming ``path`` and ``line``."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataFileError(path, f"not UTF-8 text ({err.reason} at byte {err.start})", line=line) from None


def utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Stream ``(line number, text without the line end)`` of a UTF-8 file; ``\\n`` or ``\\r\\n`` ends.

    Decoded one line at a time (a UTF-8 sequence never holds the byte ``\\n``), so an undecodable byte is
    reported at its own line and a large file is never held in memory.
    """
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            yield lineno, decode_utf8(raw.rstrip(b"\n").rstrip(b"\r"), path, lineno)


def decode_text_file(raw: bytes, path: Path) -> str:
    """A whole UTF-8 file (a leading BOM dropped) as text; an undecodable byte names its line."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataFileError(path, f"not UTF-8 text ({err.reason})", line=line) from None


def path_inside(folder: Path, relative: str, *, source: Path, line: int | None = None) -> Path:
    """``folder / relative`` for a path read from the file ``source``, refusing anything that leaves
    ``folder``: absolute paths, drive letters, ``..`` components (in ``/`` or ``\\`` spelling), NUL bytes.

    The check is on the text, not the disk, so a folder that is itself a symlink still works.
    """
    win, posix = PureWindowsPath(relative), PurePosixPath(relative)
    if (
        not relative
        or "\x00" in relative
        or posix.is_absolute()
        or win.is_absolute()
        or win.drive
        or win.root
        or ".." in win.parts  # PureWindowsPath splits on both separators
    ):
        raise DataFileError(
            source, f"path {relative[:80]!r} leaves the folder {folder} (only relative paths inside it)",
            line=line,
        )  # fmt: skip
    return folder / relative
