"""Marked blocks in markdown: the text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``.

A block is written by a program (a bench command, ``nystrom docs render``), never by hand: the markers say
so to the reader and let the writer find its text again. A *block* puts its body on lines of its own
between the markers; an *inline* block sits inside a sentence, markers and body on one line, so a number
in prose can be rendered from data too. Only the standard library is used here: the bench commands and
the docs renderer share these functions, and ``nystrom --help`` must stay free of heavy imports.
"""

from __future__ import annotations

import re
from pathlib import Path

_MARKER = re.compile(r"<!-- ([a-z0-9][a-z0-9-]*):(start|end) -->")


def start_marker(name: str) -> str:
    """The comment that opens block ``name``."""
    return f"<!-- {name}:start -->"


def end_marker(name: str) -> str:
    """The comment that closes block ``name``."""
    return f"<!-- {name}:end -->"


def block_names(text: str) -> list[str]:
    """The names of the blocks in ``text`` in order; raises ``ValueError`` for an unpaired, nested or
    repeated marker (a writer could not tell which text is its own)."""
    names: list[str] = []
    open_name: str | None = None
    for m in _MARKER.finditer(text):
        name, kind = m.group(1), m.group(2)
        if kind == "start":
            if open_name is not None:
                raise ValueError(f"block {name!r} starts inside block {open_name!r}")
            if name in names:
                raise ValueError(f"block {name!r} appears twice")
            open_name = name
        else:
            if open_name != name:
                raise ValueError(f"end of block {name!r} without its start")
            names.append(name)
            open_name = None
    if open_name is not None:
        raise ValueError(f"block {open_name!r} has no end marker")
    return names


def body(text: str, name: str) -> str | None:
    """The text between the markers of block ``name`` (None when absent); a block's own line breaks
    after the start and before the end marker are not part of it."""
    start, end = start_marker(name), end_marker(name)
    if start not in text or end not in text:
        return None
    inner = text[text.index(start) + len(start) : text.index(end)]
    if inner.startswith("\n") and inner.endswith("\n"):
        return inner[1:-1]
    return inner


def replace(text: str, name: str, new_body: str, *, inline: bool = False) -> str:
    """``text`` with block ``name``'s body replaced by ``new_body`` (the block appended at the end when
    absent). Inline blocks keep markers and body on one line."""
    start, end = start_marker(name), end_marker(name)
    block = f"{start}{new_body.strip()}{end}" if inline else f"{start}\n{new_body.rstrip()}\n{end}"
    if start in text and end in text:
        return text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    return (text.rstrip() + "\n\n" if text.strip() else "") + block + "\n"


def replace_section(path: Path, marker: str, new_body: str, *, header: str = "# Benchmarks\n") -> None:
    """Rewrite block ``marker`` of the markdown file ``path``; a missing file starts as ``header``."""
    text = path.read_text() if path.exists() else header
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace(text, marker, new_body))
