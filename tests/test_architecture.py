"""The layout rules of the developers' guide, checked on the source of both packages (the library ``nystrom``
and the lab ``nystrom_lab``): no import circles (every import statement counts, function-local and
``TYPE_CHECKING`` ones included), the library never imports the lab, and no file over 300 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
MAX_LINES = 300
PACKAGES = ("nystrom", "nystrom_lab")
LIBRARY_SUBPACKAGES = ("utils", "ops", "layers", "functional", "attention", "model", "convert", "compat")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(p for pkg in PACKAGES for p in (SRC / pkg).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (``from a import b`` is ``a.b`` when that is a module)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1]
                        + ([base] if base else [])
                    )
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    edges.add(sub if sub in mods else base)
        graph[name] = {e for e in edges if e in mods and e != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    found = cycles(import_graph())
    assert found == [], "modules importing each other in a loop: " + "; ".join(" <-> ".join(c) for c in found)


def test_library_never_imports_the_lab():
    graph = import_graph()
    lab = {m: sorted(e for e in edges if e.split(".")[0] == "nystrom_lab") for m, edges in graph.items()
           if m.split(".")[0] == "nystrom"}  # fmt: skip
    assert {m: e for m, e in lab.items() if e} == {}
    assert len(lab) > 40 and any(
        e.split(".")[0] == "nystrom" for m in graph if m.startswith("nystrom_lab") for e in graph[m]
    )


def test_library_folder_holds_only_library_code():
    """functional/, attention/, model/, compat/ and small top-level modules; commands live in the lab."""
    top = sorted(p.name for p in (SRC / "nystrom").iterdir() if not p.name.startswith(("__pycache__", ".")))
    assert top == sorted(["__init__.py", *LIBRARY_SUBPACKAGES])
    assert not [p for p in (SRC / "nystrom").rglob("*command*.py")]
    assert not [p for p in (SRC / "nystrom").rglob("*.py") if "argparse" in p.read_text()]


def test_the_checker_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_files_are_at_most_300_lines():
    long = {
        str(p.relative_to(SRC)): n
        for p in modules().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"files over {MAX_LINES} lines (split them where that makes the code clearer): {long}"
