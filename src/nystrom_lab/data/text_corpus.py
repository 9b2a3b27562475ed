"""An English corpus that exists on every machine: the running Python's own documentation text.

``python-docstrings`` = the module, class and function docstrings of the standard library's ``.py``
files (test packages excluded) plus the language-reference topics of ``pydoc_data.topics`` (the text of
docs.python.org's reference pages that ``help()`` shows). One module's docstrings, in source order, form
one document (single docstrings are mostly too short to fill a sequence); each topic is one document;
non-empty lines are the segments, written in the blank-line separated format of
:mod:`nystrom_lab.data.text`. Deterministic for a given Python build (files are visited in sorted order).
"""

from __future__ import annotations

import ast
import json
import os
import sys
import sysconfig
from pathlib import Path

BUILTIN_CORPORA = ("python-docstrings",)
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []  # a handful of stdlib files are deliberately invalid (lib2to3 test data, etc.)
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = [n for n in ast.walk(tree) if isinstance(n, nodes)]
    found.sort(key=lambda n: getattr(n, "lineno", 0))  # source order (ast.walk is breadth-first)
    return [d for n in found if (d := ast.get_docstring(n))]


def _document(text: str) -> str:
    """One document: stripped non-empty lines (a blank line would start a new document)."""
    return "\n".join(ln.strip() for ln in text.splitlines() if ln.strip())


def write_python_docstring_corpus(out: str | os.PathLike[str]) -> dict:
    """Write the ``python-docstrings`` corpus to the text file ``out``; returns its description
    (Python version, stdlib folder, files, documents, characters), also saved as ``out`` + ``.json``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
    )
    docs: list[str] = []
    for path in files:
        docs.append("\n".join(_document(d) for d in _docstrings(path)))
    try:
        from pydoc_data.topics import topics
    except ImportError as err:
        raise FileNotFoundError(f"pydoc_data.topics is missing from {root}") from err
    docs.extend(_document(topics[k]) for k in sorted(topics))
    docs = [d for d in docs if d]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    tmp.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    info = {
        "corpus": "python-docstrings",
        "python": sys.version.split()[0],
        "stdlib": str(root),
        "files": len(files),
        "documents": len(docs),
        "characters": sum(len(d) for d in docs),
    }
    Path(str(out) + ".json").write_text(json.dumps(info, indent=2))
    os.replace(tmp, out)
    return info


def resolve_corpus(paths: list[str], workdir: Path) -> list[Path]:
    """``--corpus`` values to files: a built-in corpus name is written (once) under ``workdir``; a folder
    stands for its ``*.txt`` files (sorted); anything else must be a file."""
    out: list[Path] = []
    for p in paths:
        if p in BUILTIN_CORPORA:
            target = workdir / f"{p}.txt"
            if not target.is_file():
                write_python_docstring_corpus(target)
            out.append(target)
        elif Path(p).is_dir():
            found = sorted(Path(p).rglob("*.txt"))
            if not found:
                raise FileNotFoundError(f"--corpus {p}: the folder holds no *.txt files")
            out.extend(found)
        elif Path(p).is_file():
            out.append(Path(p))
        else:
            raise FileNotFoundError(
                f"--corpus {p}: no such file or folder (built-in corpora: {', '.join(BUILTIN_CORPORA)})"
            )
    return out
