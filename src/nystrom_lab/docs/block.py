"""One rendered block of a doc: where it is, which committed files it is made from, and how."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Block:
    """Block ``name`` of ``doc`` (both relative to the repository root) is ``render(*data files)``.

    ``data`` lists every file the render reads, so the registry alone says what each doc table rests on;
    ``optional`` files are passed after them, present or not (the render says what their absence means);
    ``inline`` blocks are a phrase inside a sentence (markers and text on one line)."""

    doc: str
    name: str
    data: tuple[str, ...]
    render: Callable[..., str]
    inline: bool = False
    optional: tuple[str, ...] = ()

    def body(self, root: Path) -> str:
        """The block's text, rendered from its data files under ``root``."""
        return self.render(*(root / d for d in (*self.data, *self.optional)))
