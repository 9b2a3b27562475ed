"""The GPU numbers of the docs and of the README's figure are those of the GPU run committed in docs/gpu/.

The expected values are recomputed here from the run's CSV/JSON with the standard library only, not through
the renderers (``nystrom_lab.docs.gpu_run`` and the GPU blocks), so a renderer that reads the wrong file,
row or unit fails here; docs/gpu/ must hold one run; and the claims that the run refuted stay out of the docs.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

from nystrom_lab.docs import where_nystrom_wins as wins
from nystrom_lab.docs.registry import BLOCKS
from nystrom_lab.docs.render import problems

ROOT = Path(__file__).resolve().parents[3]
GPU = ROOT / "docs" / "gpu"
DOCS = ("README.md", "docs/benchmarks.md", "docs/training.md", "docs/gpu/launches.md")


def _rows(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _ms(rows: list[dict], method: str) -> dict[int, float]:
    return {int(r["n"]): float(r["ms"]) for r in rows if r["method"] == method and r["ms"]}


def _inference_ms(run: dict, model: str) -> dict[int, float]:
    return {r["n"]: 1e3 * r["median_s"] for r in run["rows"]
            if (r["model"], r["mode"], r["batch"]) == (model, "inference", 1) and "median_s" in r}  # fmt: skip


def _text(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def _panel(panels: list[dict], start: str) -> dict:
    return next(p for p in panels if p["title"].startswith(start))


def test_the_figure_plots_the_committed_gpu_run():
    panels = wins.panels(ROOT)
    rows = _rows(GPU / "table1_bfloat16_fwd.csv")
    attention = _panel(panels, "Attention module, GPU")
    assert attention["series"] == {wins.OURS: _ms(rows, "nystrom-64"), wins.EXACT: _ms(rows, "sdpa"),
                                   "transformers Nystromformer": _ms(rows, "hf-nystrom-64")}  # fmt: skip
    run = json.loads((GPU / "bench_models_gpu.json").read_text())
    models = next(p for p in panels if p["title"].startswith("Whole model") and "GPU" in p["title"])
    assert models["series"] == {label: _inference_ms(run, m) for m, label in wins.MODEL_LABELS.items()}
    gpu = (GPU / "env.txt").read_text().split(",")[0]
    assert gpu in attention["title"] and gpu in models["title"]
    assert all(len(s) >= 2 for s in (*attention["series"].values(), *models["series"].values()))


def test_the_figure_reads_the_files_not_constants(tmp_path):
    """A changed number in the committed run is a changed point of the figure."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    csv_path = tmp_path / "docs/gpu/table1_bfloat16_fwd.csv"
    rows = _rows(csv_path)
    for r in rows:
        if (r["method"], r["n"]) == ("sdpa", "4096"):
            r["ms"] = "0.5"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert _panel(wins.panels(tmp_path), "Attention module, GPU")["series"][wins.EXACT][4096] == 0.5


def _crossing(ratio: dict[int, float]) -> float:
    """Where SDPA ÷ ours passes 1 for good, log-log between the two lengths around it."""
    ns = sorted(ratio)
    last = max(i for i, n in enumerate(ns) if ratio[n] < 1)
    a, b = ns[last], ns[last + 1]
    t = math.log(ratio[a]) / (math.log(ratio[a]) - math.log(ratio[b]))
    return a * (b / a) ** t


def test_the_gpu_numbers_the_docs_state_are_the_run_s():
    fwd = _rows(GPU / "table1_bfloat16_fwd.csv")
    sdpa, ours = _ms(fwd, "sdpa"), _ms(fwd, "nystrom-64")
    speed = {n: sdpa[n] / ours[n] for n in ours}
    run = json.loads((GPU / "bench_models_gpu.json").read_text())
    nys, bert, hf = (_inference_ms(run, m) for m in ("ours-nystrom", "hf-bert", "hf-nystromformer"))
    readme, bench = _text("README.md"), _text("docs/benchmarks.md")
    module = (f"forward is {1 / speed[4096]:.1f}× slower than exact SDPA (FlashAttention) at 4K tokens and "
              f"{speed[16384]:.1f}× faster at 16K")  # fmt: skip
    assert module in readme
    assert f"below about {_crossing(speed) / 1024:.0f}K tokens exact SDPA is the better choice" in readme
    assert (f"bf16 forward: {1 / speed[4096]:.1f}× slower at 4K, {speed[16384]:.1f}× faster at 16K, "
            f"{speed[65536]:.1f}× faster at 64K, {speed[131072]:.1f}× faster at 128K") in bench  # fmt: skip
    for n, k in ((4096, "4K"), (16384, "16K")):
        line = f"{nys[n]:.1f} ms against ours with SDPA's {_inference_ms(run, 'ours-softmax')[n]:.1f} ms and transformers' BERT's {bert[n]:.1f} ms at {k}"
        assert line in readme and line in bench
    vs_hf = sorted(hf[n] / nys[n] for n in nys)
    assert f"against transformers' Nystromformer ours is {vs_hf[0]:.1f}–{vs_hf[-1]:.1f}× faster" in readme
    crash = next(r["error"] for r in run["rows"] if (r["model"], r["mode"]) == ("ours-nystrom", "train"))
    assert f"crashed: `{crash}`" in _text("docs/training.md") and crash in bench


def test_the_gpu_tests_and_launches_the_docs_state_are_the_run_s():
    last = (GPU / "gpu_tests.txt").read_text().strip().splitlines()[-1]
    counts = ", ".join(
        f"{a} {b}"
        for a, b in (w.split()[:2] for w in last.split(", "))
        if b in ("passed", "failed", "skipped")
    )
    assert f"`pytest -m gpu`: {counts}" in _text("docs/benchmarks.md") and counts in _text("README.md")
    launches = json.loads((GPU / "launches_gpu.json").read_text())
    doc = _text("docs/gpu/launches.md")
    for case in launches["cases"].values():
        ours, theirs = case["ours"]["forward"], case["hf"]["forward"]
        assert f"| forward | {ours['launches']} | {theirs['launches']} |" in doc


def test_docs_gpu_holds_one_run():
    """Every table of docs/gpu/ was measured with the software that env.txt names (no earlier run's table
    stands beside this run's), and every GPU block reads docs/gpu/."""
    env = (GPU / "env.txt").read_text().splitlines()[1].split()
    torch, transformers = env[env.index("torch") + 1], env[env.index("transformers") + 1]
    tables = sorted(GPU.glob("table1_*.csv"))
    assert tables and all((t.with_suffix(".json")).is_file() for t in tables)
    for t in tables:
        info = json.loads(t.with_suffix(".json").read_text())["info"]
        assert (info["torch"], info["transformers"]) == (torch, transformers), t.name
    for name in ("bench_models_gpu.json", "bench_models_gpu_graphed.json"):
        machine = json.loads((GPU / name).read_text())["machine"]
        assert (machine["torch"], machine["transformers"]) == (torch, transformers), name
    gpu_blocks = [b for b in BLOCKS if b.name.startswith(("gpu-", "launches-gpu"))]
    assert len(gpu_blocks) >= 10 and all(d.startswith("docs/gpu/") for b in gpu_blocks for d in b.data)


def test_a_changed_gpu_number_makes_the_prose_stale(tmp_path):
    root = tmp_path
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copytree(ROOT / "docs", root / "docs")
    for data in {d for b in BLOCKS for d in b.data if not d.startswith("docs/")}:
        (root / data).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / data, root / data)
    path = root / "docs/gpu/bench_models_gpu.json"
    run = json.loads(path.read_text())
    for r in run["rows"]:
        if (r["model"], r["mode"], r["n"]) == ("hf-bert", "inference", 4096):
            r["median_s"] = 0.0051
    path.write_text(json.dumps(run))
    stale = problems(root)
    assert "README.md: block 'gpu-summary' is stale" in "\n".join(stale)
    assert any("'gpu-models-summary' is stale" in p for p in stale)


REFUTED = (
    "issue #28", "every `gpu` test passes", "all pass, and", "No per-call host sync remains", "syncs (none on ours)",
    "below ≈ 20K", "up to ~20K", "n ≈ 20–30K", "1.3–1.9× slower", "trains end to end", "Not run on the GPU in this session",
)  # fmt: skip


def test_no_gpu_claim_that_the_run_refuted_is_left():
    found = [(doc, claim) for doc in DOCS for claim in REFUTED if claim in _text(doc)]
    assert found == []
