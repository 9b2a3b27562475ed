"""The layout rules of the developers' guide, checked on the source of both packages (the library ``nystrom``
and the lab ``nystrom_lab``): no import circles (every import statement counts, function-local and
``TYPE_CHECKING`` ones included), the library's imports point downward through its layers, the library
never imports the lab, each op or layer piece asks the CPU/accelerator question in one dispatch function,
each op folder with a reference keeps it in ``naive.py``, a leaf that no module of either package
imports (only the tests do), and no file over 300 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
MAX_LINES = 300
PACKAGES = ("nystrom", "nystrom_lab")
LIBRARY_SUBPACKAGES = ("utils", "ops", "layers", "functional", "attention", "model", "convert", "compat")
#: the library's layers, lowest first: a module imports its own subpackage and those below, never above
#: (``functional`` is the public path over ``ops``; ``convert`` and ``compat`` sit side by side at the top)
RANK = {
    "utils": 0,
    "ops": 1,
    "functional": 2,
    "layers": 3,
    "attention": 4,
    "model": 5,
    "convert": 6,
    "compat": 6,
}
#: the upward imports there are, each with its reason: (importing module, imported subpackage)
UPWARD = {
    ("nystrom", "*"): "the package root re-exports the public names of every layer",
    ("nystrom.model", "convert"): "the public path nystrom.model re-exports from_bert, to_hf, to_long, ...",
    (
        "nystrom.model.modeling_nystromformer",
        "convert",
    ): "model.to_hf() calls the exporter, imported when called",
}
#: the one function per op or layer piece that asks the CPU/accelerator predicate; callers above ask nothing
DISPATCH = {
    "nystrom/ops/nystrom/dispatch.py": "nystrom_attention",
    "nystrom/ops/pinv/dispatch.py": "iterative_pinv",
    "nystrom/ops/softmax/sdpa.py": "softmax_attention",
    "nystrom/ops/conv/banded.py": "conv_path",
    "nystrom/layers/ffn.py": "row_blocks",
    "nystrom/layers/projection.py": "project_heads",
}
PREDICATE = re.compile(r"(?<!\w)accelerator_path\s*\(")  # the call, not force_accelerator_path()
#: op folder -> its plain reference, the one every implementation is tested against
REFERENCES = {"nystrom": "naive.py", "pinv": "naive.py", "conv": "naive.py"}


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


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Library imports that point to a higher layer (or sideways into another subpackage of the same
    rank), or into the public path ``nystrom.functional``, less the reasoned exceptions of ``UPWARD``."""
    bad = []
    for src, edges in sorted(graph.items()):
        if src == "nystrom" or src.split(".")[0] != "nystrom":
            continue
        sub = src.split(".")[1]
        for dst in sorted(e for e in edges if e.startswith("nystrom.")):
            target = dst.split(".")[1]
            if target == sub or (src, target) in UPWARD:
                continue
            if target == "functional" or RANK[target] >= RANK[sub]:
                bad.append(f"{src} -> {dst}")
    return bad


def test_imports_point_downward_through_the_library_layers():
    graph = import_graph()
    assert {m.split(".")[1] for m in graph if m.startswith("nystrom.")} == set(RANK)
    assert upward_imports(graph) == []
    used = {
        (src, dst.split(".")[1])
        for src, edges in graph.items()
        for dst in edges
        if dst.startswith("nystrom.")
    }
    assert {k for k in UPWARD if k[1] != "*"} <= used  # no stale exception


def test_the_layer_checker_finds_an_upward_import():
    graph = {"nystrom.ops.x": {"nystrom.layers.y"}, "nystrom.layers.y": {"nystrom.ops.x", "nystrom.utils.z"},
             "nystrom.convert.c": {"nystrom.compat.d"}, "nystrom.attention.a": {"nystrom.functional"}}  # fmt: skip
    assert upward_imports(graph) == [
        "nystrom.attention.a -> nystrom.functional", "nystrom.convert.c -> nystrom.compat.d",
        "nystrom.ops.x -> nystrom.layers.y",
    ]  # fmt: skip


def predicate_askers(sources: dict[str, str]) -> dict[str, set[str]]:
    """file -> the functions in which the predicate is called: every line the grep finds (comments cut),
    attributed to the innermost function around it (``<module>`` outside any)."""
    found: dict[str, set[str]] = {}
    for name, text in sources.items():
        lines = [i for i, line in enumerate(text.splitlines(), 1) if PREDICATE.search(line.split("#")[0])]
        if not lines:
            continue
        spans = [(f.lineno, f.end_lineno, f.name) for f in ast.walk(ast.parse(text))
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]  # fmt: skip
        for line in lines:
            around = [s for s in spans if s[0] <= line <= s[1]]
            found.setdefault(name, set()).add(max(around)[2] if around else "<module>")
    return found


def library_sources() -> dict[str, str]:
    """The library's files but the predicate's own (utils/device.py), by path below src/."""
    files = sorted((SRC / "nystrom").rglob("*.py"))
    return {
        str(p.relative_to(SRC)): p.read_text() for p in files if p != SRC / "nystrom" / "utils" / "device.py"
    }


def test_each_op_asks_the_accelerator_question_in_one_dispatch_function():
    """``accelerator_path(...)`` is called only in the dispatch functions of ``DISPATCH``, one per op or
    layer piece, and imported only where they live: a branch scattered into a caller (a module, the
    model) fails here."""
    sources = library_sources()
    assert predicate_askers(sources) == {f: {fn} for f, fn in DISPATCH.items()}
    importers = {f for f, text in sources.items() if re.search(r"import [^\n]*\baccelerator_path\b", text)}
    assert importers == set(DISPATCH)


def test_the_dispatch_checker_finds_a_scattered_branch():
    planted = "def forward(self, x):\n    if accelerator_path(x):  # a second decision\n        return x\n"
    allowed = 'def f(x):\n    """force_accelerator_path() is not a call of it"""\n    return device.accelerator_path(x)\n'
    assert predicate_askers({"a.py": planted, "b.py": allowed, "c.py": "x = 1  # accelerator_path(x)\n"}) == {
        "a.py": {"forward"},
        "b.py": {"f"},
    }


def test_each_op_keeps_one_plain_reference():
    ops = SRC / "nystrom" / "ops"
    assert all((ops / op / reference).is_file() for op, reference in REFERENCES.items())
    named = [
        p for p in ops.rglob("*.py") if p.stem in ("naive", "reference") and p.parent.name not in REFERENCES
    ]
    assert named == []


def naive_importers(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> nystrom.ops.<op>.naive`` for every module that imports an op's reference."""
    return [
        f"{src} -> {dst}"
        for src, edges in sorted(graph.items())
        for dst in sorted(edges)
        if dst.startswith("nystrom.ops.") and dst.endswith(".naive")
    ]


def test_the_references_are_leaves_only_the_tests_import():
    """A reference that the code also runs checks itself: the tests could no longer catch a change to it.
    So no module under src/ (library or lab) imports an op's ``naive.py``; the implementations keep
    their own copy (pinv's CPU path is ``iterations.py``)."""
    graph = import_graph()
    assert {f"nystrom.ops.{op}.naive" for op in REFERENCES} <= set(graph)  # the rule looks at the real files
    offenders = naive_importers(graph)
    assert offenders == [], "modules importing an op's naive.py reference: " + "; ".join(offenders)


def test_the_reference_checker_finds_an_importer():
    graph = {"nystrom.ops.pinv.dispatch": {"nystrom.ops.pinv.naive", "nystrom.ops.pinv.op"},
             "nystrom_lab.bench.x": {"nystrom.ops.conv.naive"}, "nystrom.ops.pinv.naive": set()}  # fmt: skip
    assert naive_importers(graph) == [
        "nystrom.ops.pinv.dispatch -> nystrom.ops.pinv.naive", "nystrom_lab.bench.x -> nystrom.ops.conv.naive"
    ]  # fmt: skip


def test_library_folder_holds_only_library_code():
    """utils/, ops/, layers/, functional/, attention/, model/, convert/, compat/ and the package root;
    commands live in the lab."""
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
