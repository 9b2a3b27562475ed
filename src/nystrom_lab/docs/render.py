"""Rewrite every registered block of README.md and docs/**/*.md from the committed data, or report the
blocks whose committed text differs from what the data renders to now (``nystrom docs render/check``).

Legend: a *doc* is a markdown file of the repository, a *block* a marked part of it
(:mod:`nystrom_lab.docs.markers`), its *data* the committed JSON/CSV/JSONL files it is rendered from.
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.docs import markers
from nystrom_lab.docs.registry import BLOCKS


def find_root(start: Path) -> Path:
    """The repository root at or above ``start``: the folder holding README.md and docs/benchmarks.md."""
    for folder in (start, *start.parents):
        if (folder / "README.md").is_file() and (folder / "docs" / "benchmarks.md").is_file():
            return folder
    raise FileNotFoundError(f"no README.md with docs/benchmarks.md at or above {start}: pass --root")


def docs(root: Path) -> list[Path]:
    """Every markdown file the rendered blocks may live in."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def rendered(root: Path) -> dict[Path, str]:
    """Each doc's text with every registered block rendered from the data (in memory; nothing written)."""
    out: dict[Path, str] = {}
    for block in BLOCKS:
        path = root / block.doc
        text = out.get(path, path.read_text(encoding="utf-8") if path.is_file() else "")
        out[path] = markers.replace(text, block.name, block.body(root), inline=block.inline)
    return out


def problems(root: Path, texts: dict[Path, str] | None = None) -> list[str]:
    """What ``nystrom docs check`` reports: each stale or missing block, and markers no render owns.

    ``texts``: the committed docs to check (default: read from ``root``); a test passes altered copies."""
    texts = texts or {p: p.read_text(encoding="utf-8") for p in docs(root)}
    owned = {(root / b.doc, b.name) for b in BLOCKS}
    found = []
    for path, text in texts.items():
        try:
            names = markers.block_names(text)
        except ValueError as err:
            found.append(f"{path.relative_to(root)}: {err}")
            continue
        found += [f"{path.relative_to(root)}: block {n!r} has no render (not in the registry)" for n in names
                  if (path, n) not in owned]  # fmt: skip
    new = rendered(root)
    for block in BLOCKS:
        path = root / block.doc
        old = markers.body(texts.get(path, ""), block.name)
        if old is None:
            found.append(f"{block.doc}: block {block.name!r} is missing (its markers are not in the doc)")
        elif old != markers.body(new[path], block.name):
            found.append(
                f"{block.doc}: block {block.name!r} is stale: it differs from {', '.join(block.data)}"
            )
    return found


def write(root: Path) -> list[str]:
    """Rewrite the docs whose blocks changed; ``doc: block`` of each block rewritten."""
    new = rendered(root)
    changed = []
    for block in BLOCKS:
        path = root / block.doc
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
        if markers.body(old, block.name) != markers.body(new[path], block.name):
            changed.append(f"{block.doc}: {block.name}")
    for path, text in new.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return changed
