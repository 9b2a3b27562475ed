"""Blocks of docs/results.md (LRA) and the README's ListOps step time, from the committed run folders
under experiments/ and the training benchmark's JSON.

Legend: a *run* is one training output folder (``results.json``, ``metrics.jsonl``, ``train_config.json``).
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.data.records import median_step_s, read_metrics
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_json
from nystrom_lab.text.curves import curves_of, curves_table

DOC = "docs/results.md"
STEP = ("docs/bench_training.json", "docs/bench_training_cached.json")
NYS, SOFT = "experiments/listops-nystrom-64-seed0", "experiments/listops-softmax-seed0"
PATHFINDER = "experiments/pathfinder-nystrom-64-quick-seed0"
#: the runs of the plateau table: (what it was, its init, its folder, whether it was evaluated on test)
PLATEAU = (
    ("official protocol, fp32 (2026-11-22/23, CPU)", "BERT-style: every Linear N(0, 0.02)", "experiments/listops-nystrom-64-seed0-bert-init", False),
    ("official protocol, bf16 autocast (above)", "PyTorch default Linears, as the official code", NYS, True),
    ("diagnostic, 10× the lr", "PyTorch default", "experiments/listops-diagnostics/diag-listops-lr1e-3", True),
    ("diagnostic, exact softmax attention", "PyTorch default", "experiments/listops-diagnostics/diag-listops-softmax-lr1e-3", True),
)  # fmt: skip
PLATEAU_FILES = tuple(f"{folder}/{name}" for *_, folder, tested in PLATEAU
                      for name in ("metrics.jsonl", "train_config.json", *(("results.json",) if tested else ())))  # fmt: skip


def listops_step(default: Path, cached: Path) -> str:
    """One official ListOps training step (``nystrom bench training``), ours and against lucidrains'."""
    run, kept = read_json(default), read_json(cached)
    res = run["listops"]["results"]
    return (
        f"{res['nystrom']['ms'] / 1e3:.2f} s on {run['info']['threads']} cores in fp32, "
        f"{res['lucidrains']['speedup']:.2f}× faster than the same model with lucidrains' attention "
        f"({kept['listops']['results']['lucidrains']['speedup']:.2f}× with freed memory kept for both)"
    )


def run_step_time(metrics: Path) -> str:
    """The median seconds per step a training log recorded (pauses and resumed clocks left out)."""
    train = [r for r in read_metrics(metrics) if r["split"] == "train"]
    return f"{median_step_s(train):.2f} s"


def ours(nys: Path, soft: Path, pathfinder: Path) -> str:
    """Test accuracy of our LRA runs (best-dev weights); the tasks without data say so."""
    n, s, p = read_json(nys), read_json(soft), read_json(pathfinder)
    return "\n".join(
        [
            "| model | ListOps | Text | Retrieval | Image | Pathfinder | avg |",
            "|---|---|---|---|---|---|---|",
            f"| `nystrom-64` | {100 * n['test']['accuracy']:.2f} (official protocol; below the 36.5 bar, see below) | "
            f"no data here | no data here | no data here | {100 * p['test']['accuracy']:.1f} (shortened, chance) | – |",
            f"| `softmax` | {100 * s['test']['accuracy']:.2f} (official protocol, same data and seed; best dev "
            f"{100 * s['best_dev']:.2f} at step {s['best_step']}) | not run | not run | not run | not run | – |",
        ]
    )


def listops_curve(metrics: Path) -> str:
    """Per dev evaluation: the mean train loss over the steps since the one before, dev accuracy and loss."""
    recs = read_metrics(metrics)
    train, dev = [r for r in recs if r["split"] == "train"], [r for r in recs if r["split"] == "dev"]
    every = dev[1]["step"] - dev[0]["step"]
    out = [
        f"| step | train loss (mean over the {every} steps before) | dev accuracy % | dev loss |",
        "|---:|---:|---:|---:|",
    ]
    for d in dev:
        losses = [r["loss"] for r in train if d["step"] - every < r["step"] <= d["step"]]
        out.append(
            f"| {d['step']} | {sum(losses) / len(losses):.3f} | {100 * d['accuracy']:.2f} | {d['loss']:.3f} |"
        )
    return "\n".join(out)


def _lr(lr: float) -> str:
    """A learning rate as the commands write it: ``1e-4``."""
    return f"{lr:.0e}".replace("e-0", "e-").replace("e+0", "e")


def plateau(*files: Path) -> str:
    """Every ListOps run on the long data: steps run, best dev (and test, where it was evaluated)."""
    given = {p.parent.as_posix(): p.parent for p in files}
    out = ["| run | init | lr | steps run | best dev % | log |", "|---|---|---|---:|---:|---|"]
    for what, init, folder, tested in PLATEAU:
        run = next(path for key, path in given.items() if key.endswith(folder))
        recs = read_metrics(run / "metrics.jsonl")
        steps = max(r["step"] for r in recs if r["split"] == "train")
        best = max(r["accuracy"] for r in recs if r["split"] == "dev")
        test = f" (test {100 * read_json(run / 'results.json')['test']['accuracy']:.2f})" if tested else ""
        lr = _lr(read_json(run / "train_config.json")["lr"])
        out.append(f"| {what} | {init} | {lr} | {steps} | {100 * best:.2f}{test} | `{folder}/` |")
    return "\n".join(out)


def fig6(nystrom: Path, softmax: Path) -> str:
    """Dev MLM / SOP accuracy of the Figure-6-style runs from MiniLM (their committed logs)."""
    curves = {
        name: curves_of([r for r in read_metrics(p) if r["split"] == "dev"])
        for name, p in (("nystrom-64", nystrom), ("softmax", softmax))
    }
    return curves_table(curves)


BLOCKS = [
    Block("README.md", "listops-step", STEP, listops_step, inline=True),
    Block(DOC, "listops-step", STEP, listops_step, inline=True),
    Block(DOC, "listops-run-step", (f"{NYS}/metrics.jsonl",), run_step_time, inline=True),
    Block(DOC, "lra-ours", (f"{NYS}/results.json", f"{SOFT}/results.json", f"{PATHFINDER}/results.json"), ours),
    Block(DOC, "listops-curve", (f"{NYS}/metrics.jsonl",), listops_curve),
    Block(DOC, "listops-plateau", PLATEAU_FILES, plateau),
    Block(DOC, "fig6-curves", ("docs/fig5_nystrom-64_metrics.jsonl", "docs/fig5_softmax_metrics.jsonl"), fig6),
]  # fmt: skip
