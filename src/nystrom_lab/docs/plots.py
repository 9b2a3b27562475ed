"""``nystrom docs render --plots``: redraw the docs' figures that are drawn from data files, with the
benchmarks' own plot functions, so a figure cannot show another run than the table beside it (and the
README's opening figure, :mod:`nystrom_lab.docs.where_nystrom_wins`).

Not redrawn: figures computed from tensors (``approx_attention_maps.png``: Figure 3 needs the MiniLM run)
and the training curves of experiments/ (each run draws its own).
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.bench.approx import report as approx_report
from nystrom_lab.bench.models import report as models_report
from nystrom_lab.bench.table1 import report as table1_report
from nystrom_lab.bench.training import report as training_report
from nystrom_lab.docs import where_nystrom_wins
from nystrom_lab.docs.data import read_csv, read_json
from nystrom_lab.docs.gpu_run import TABLES


def whole_models(root: Path) -> Path:
    """docs/bench_models.png: the runs of the two tables below it in docs/benchmarks.md (the inference run
    after the fused linears, the 3-round training steps before them)."""
    inference = read_json(root / "docs/bench_inference/bench_models.json")
    training = read_json(root / "docs/bench_models.json")
    merged = {
        **training,
        "rows": [r for r in inference["rows"] if r["mode"] == "inference"]
        + [r for r in training["rows"] if r["mode"] == "train"],
        "title": f"Whole models, {training['size']} size, {training['dtype']} on CPU ({training['machine']['cpu']}, "
        f"{training['machine']['threads']} threads): inference {inference['rounds']} rounds after the fused linears, "
        f"training steps {training['rounds']} rounds",
    }
    return models_report.plot(merged, root / "docs/bench_models.png")


def draw(root: Path) -> list[Path]:
    """Redraw every figure drawn from data; the paths drawn."""
    docs = root / "docs"
    for suffix, malloc in (("", "system"), ("_cached", "cached")):
        training_report.plot(
            read_json(docs / f"bench_training{suffix}.json"), docs / f"training{suffix}.png", malloc=malloc
        )
    table1_report.plot(
        read_csv(docs / "table1_fwd.csv"), read_json(docs / "table1_fwd.json"), docs / "table1_fwd.png"
    )
    approx_report.plot(read_csv(docs / "approx.csv"), docs / "approx.png")
    drawn = [docs / p for p in ("training.png", "training_cached.png", "table1_fwd.png", "approx.png")]
    for table, png in (
        ("bfloat16_fwd", "gpu/table1_bf16_fwd.png"),
        ("bfloat16_fwdbwd", "gpu/table1_bf16_fwdbwd.png"),
    ):
        data = root / TABLES[table]  # the GPU run's bf16 tables (docs/benchmarks.md, "On a GPU")
        table1_report.plot(read_csv(data), read_json(data.with_suffix(".json")), docs / png)
        drawn.append(docs / png)
    return [*drawn, whole_models(root), where_nystrom_wins.draw(root)]
