"""Docs rendered from data: every measured table of README.md and docs/ is a marked block that
``nystrom docs render`` writes from the committed JSON/CSV, and the committed text must be what the data
renders to now. Rendering reads files only (no benchmark, no torch), so this runs in about a second."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nystrom_lab.cli import main
from nystrom_lab.docs import markers
from nystrom_lab.docs.registry import BLOCKS
from nystrom_lab.docs.render import docs, problems, rendered, write

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "transformers", "numpy", "nystrom", "matplotlib")


def test_committed_docs_are_what_their_data_renders_to():
    found = problems(ROOT)
    assert found == [], "run `nystrom docs render`:\n" + "\n".join(found)


def test_every_block_reads_committed_files_and_names_are_unique():
    keys = [(b.doc, b.name) for b in BLOCKS]
    assert len(keys) == len(set(keys))
    missing = [f"{b.doc}: {b.name}: {d}" for b in BLOCKS for d in b.data if not (ROOT / d).is_file()]
    assert missing == []


def _copy_of_the_repo(tmp_path: Path) -> Path:
    """README.md, docs/ and every data file a block reads, under ``tmp_path``."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for data in {d for b in BLOCKS for d in b.data if not d.startswith("docs/")}:
        (tmp_path / data).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / data, tmp_path / data)
    return tmp_path


def test_the_check_catches_a_changed_number_in_a_doc_and_in_its_data(tmp_path):
    root = _copy_of_the_repo(tmp_path)
    assert problems(root) == []
    bench = root / "docs/benchmarks.md"
    text = bench.read_text()
    block = markers.body(text, "bench-attention")
    assert "| 65536 | 179.1 |" in block  # our core at 64K tokens, from bench_attention.csv
    bench.write_text(text.replace("| 65536 | 179.1 |", "| 65536 | 171.9 |"))
    assert problems(root) == [
        "docs/benchmarks.md: block 'bench-attention' is stale: it differs from docs/bench_attention.csv, "
        "docs/bench_attention.json"
    ]
    bench.write_text(text)  # the doc as committed, but a number of the data changed: the doc is now stale
    data = root / "docs/bench_training.json"
    run = json.loads(data.read_text())
    run["listops"]["results"]["nystrom"]["ms"] = 501.0
    data.write_text(json.dumps(run))
    stale = problems(root)
    assert "README.md: block 'listops-step' is stale: it differs from docs/bench_training.json, docs/bench_training_cached.json" in stale
    assert any("docs/benchmarks.md: block 'bench-training' is stale" in p for p in stale)
    assert write(root)  # `nystrom docs render` rewrites them ...
    assert problems(root) == []  # ... and then they agree
    assert "takes <!-- listops-step:start -->0.50 s on 2 cores" in (root / "README.md").read_text()


def test_docs_check_command_exits_1_listing_stale_blocks(tmp_path, capsys):
    root = _copy_of_the_repo(tmp_path)
    assert main(["docs", "check", "--root", str(root)]) == 0
    results = root / "docs/results.md"
    results.write_text(results.read_text().replace("| 5000 | 1.734 | 36.50 | 1.702 |", "| 5000 | 1.734 | 36.60 | 1.702 |"))
    assert main(["docs", "check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "docs/results.md: block 'listops-curve' is stale" in err and "nystrom docs render" in err
    assert main(["docs", "render", "--root", str(root)]) == 0
    assert "rendered docs/results.md: listops-curve" in capsys.readouterr().out
    assert main(["docs", "check", "--root", str(root)]) == 0


def test_unknown_missing_and_broken_markers_are_reported(tmp_path):
    texts = {p: p.read_text() for p in docs(ROOT)}
    models = ROOT / "docs/models.md"
    texts[models] += "\n<!-- made-up:start -->1<!-- made-up:end -->\n"
    results = ROOT / "docs/results.md"
    texts[results] = texts[results].replace("<!-- fig6-curves:end -->", "")
    found = problems(ROOT, texts)
    assert "docs/models.md: block 'made-up' has no render (not in the registry)" in found
    assert "docs/results.md: block 'fig6-curves' has no end marker" in found
    assert "docs/results.md: block 'fig6-curves' is missing (its markers are not in the doc)" in found


def test_markers_replace_blocks_and_inline_phrases():
    text = "a <!-- x:start -->old<!-- x:end --> b\n\n<!-- t:start -->\n| 1 |\n<!-- t:end -->\n"
    assert markers.block_names(text) == ["x", "t"]
    text = markers.replace(text, "x", "new", inline=True)
    text = markers.replace(text, "t", "| 2 |\n")
    assert text == "a <!-- x:start -->new<!-- x:end --> b\n\n<!-- t:start -->\n| 2 |\n<!-- t:end -->\n"
    assert markers.body(text, "t") == "| 2 |" and markers.body(text, "x") == "new"
    assert markers.replace("", "u", "body") == "<!-- u:start -->\nbody\n<!-- u:end -->\n"
    with pytest.raises(ValueError, match="starts inside"):
        markers.block_names("<!-- a:start --><!-- b:start --><!-- b:end --><!-- a:end -->")


def test_every_figure_is_linked_and_every_data_file_is_rendered_or_linked():
    texts = "\n".join(p.read_text() for p in docs(ROOT))
    readme = (ROOT / "README.md").read_text()  # README.md links docs/ figures by their docs/ path
    rendered_from = {d for b in BLOCKS for d in b.data}
    unlinked, orphans = [], []
    for path in sorted((ROOT / "docs").rglob("*")):
        rel = path.relative_to(ROOT / "docs").as_posix()
        if path.suffix == ".png" and f"]({rel})" not in texts and f"](docs/{rel})" not in readme:
            unlinked.append(rel)
        elif path.suffix in (".json", ".jsonl", ".csv", ".txt") and f"docs/{rel}" not in rendered_from:
            folder = path.parent.relative_to(ROOT / "docs").as_posix() + "/"
            if rel not in texts and (folder == "./" or f"]({folder})" not in texts):
                orphans.append(rel)
    assert unlinked == [] and orphans == []


def test_rendering_loads_no_heavy_package():
    code = (
        "import json, sys\nfrom pathlib import Path\nfrom nystrom_lab.docs.render import rendered\n"
        f"rendered(Path({str(ROOT)!r}))\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_render_is_a_fixed_point():
    """Rendering the committed docs changes nothing (so `docs render` on a clean tree writes nothing)."""
    for path, text in rendered(ROOT).items():
        assert text == path.read_text(), path
