"""The long-context experiment's fine-tuning half: Brown genre classification.

Legend: N long length (4096), W window length (512).

Each Brown document (about 2,600 WordPiece tokens; ``nystrom data brown OUT --genres`` writes the tables)
is classified into its genre group (press, non-fiction, learned, fiction) by fine-tuning the continued
models of ``nystrom pretrain long-context``:

- ``window-512``: window-512's model on the first W tokens of each document (what a 512-token user gets);
- ``nystrom-4096``: nystrom-4096's model on whole documents (N tokens; nothing is cut);
- ``nystrom-4096-first512``: nystrom-4096's model on the first W tokens (separates the length from the model).

Same tables, batch, learning rate, epochs, precision and seed for each (``nystrom finetune``, best
validation step kept). The test split is small (93 documents), so the report gives each accuracy with
its Wilson 95 % interval and compares every run with window-512 on the *same* documents: the exact
McNemar test on the documents where exactly one of the two is right, and a paired bootstrap interval of
the accuracy difference.
"""

from __future__ import annotations

import csv
import json
import math
import random
import subprocess
import sys
from pathlib import Path

#: run name -> (pretrained variant whose model is fine-tuned, tokens per document)
GENRE_RUNS: dict[str, tuple[str, int]] = {
    "window-512": ("window-512", 512),
    "nystrom-4096": ("nystrom-4096", 4096),
    "nystrom-4096-first512": ("nystrom-4096", 512),
}
BATCH, LR, EPOCHS, PRECISION = 8, 5e-5, 3, "bf16"
BASELINE = "window-512"


def run_dir(out: Path, name: str, seed: int) -> Path:
    return out / "genre" / f"{name}-seed{seed}"


def finetune_args(
    out: Path, genres: Path, name: str, seed: int, *, device: str = "auto",
    runs: dict[str, tuple[str, int]] = GENRE_RUNS, epochs: int = EPOCHS,
) -> list[str]:  # fmt: skip
    """The ``nystrom finetune`` arguments of one run on ``device``; ``runs``: run name -> (pre-trained
    variant, a folder under ``out``, and tokens per document)."""
    variant, length = runs[name]
    return [
        "finetune", "--init-from", str(out / variant), "--max-length", str(length), "--seed", str(seed),
        "--train-file", str(genres / "train.csv"), "--validation-file", str(genres / "validation.csv"),
        "--test-file", str(genres / "test.csv"), "--batch-size", str(BATCH), "--lr", str(LR),
        "--epochs", str(epochs), "--precision", PRECISION, "--device", device, "--no-progress",
        "--out", str(run_dir(out, name, seed)),
    ]  # fmt: skip


def train_genre(
    out: Path, genres: Path, *, seeds: tuple[int, ...] = (0,), names: tuple[str, ...] | None = None,
    device: str = "auto", runs: dict[str, tuple[str, int]] = GENRE_RUNS, epochs: int = EPOCHS,
) -> None:  # fmt: skip
    """Fine-tune every (seed, run) not finished yet (``finetune_results.json``), each in a child process
    (an interrupted one resumes from its ``last`` checkpoint)."""
    missing = [p for p in (genres / f"{s}.csv" for s in ("train", "validation", "test")) if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{missing[0]} not found: write the genre tables with `nystrom data brown DIR --genres`"
        )
    names = tuple(runs) if names is None else names
    for variant in {runs[n][0] for n in names}:
        if not (out / variant / "results.json").is_file():
            raise FileNotFoundError(
                f"{out / variant} has not finished pre-training: run `nystrom pretrain long-context` first"
            )
    for seed in seeds:
        for name in names:
            if (run_dir(out, name, seed) / "finetune_results.json").is_file():
                continue
            args = finetune_args(out, genres, name, seed, device=device, runs=runs, epochs=epochs)
            cmd = [sys.executable, "-m", "nystrom_lab.cli", *args]
            print(f"[long-context genre] {name} seed {seed}: {' '.join(cmd[3:])}", flush=True)
            subprocess.run(cmd, check=True)


def wilson(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion (95 % for z = 1.96)."""
    if total == 0:
        return (0.0, 1.0)
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (a right and b wrong, and vice versa)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_bootstrap(
    a: list[bool], b: list[bool], *, samples: int = 10000, seed: int = 0
) -> tuple[float, float]:
    """95 % percentile interval of accuracy(a) − accuracy(b) over documents resampled with replacement."""
    rng = random.Random(seed)
    n = len(a)
    diffs = sorted(sum(a[i] - b[i] for i in (rng.randrange(n) for _ in range(n))) / n for _ in range(samples))
    return diffs[int(0.025 * samples)], diffs[int(0.975 * samples) - 1]


def _predictions(folder: Path) -> list[str]:
    with (folder / "predictions_test.tsv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [r["prediction"] for r in sorted(rows, key=lambda r: int(r["index"]))]


#: (results key, run, the run it is compared with): the whole-document run against its own first 512 tokens
FIRST_512_PAIRS = (("vs_first_512_tokens", "nystrom-4096", "nystrom-4096-first512"),)


def genre_report(
    out: Path, genres: Path, *, seeds: tuple[int, ...] = (0,), setups: dict[str, tuple[str, int]] = GENRE_RUNS,
    baseline: str = BASELINE, pairs: tuple[tuple[str, str, str], ...] = FIRST_512_PAIRS, epochs: int = EPOCHS,
) -> dict:  # fmt: skip
    """``out/genre/results.json`` and ``results.md``: per finished run its test accuracy (Wilson 95 %),
    macro-F1 and per-label recall, and against ``baseline`` (key ``vs_window_512``) and each of ``pairs``
    (``setups``: run name -> (pre-trained variant, tokens per document))
    on the same seed the McNemar test and the paired bootstrap interval of the difference."""
    with (genres / "test.csv").open(encoding="utf-8", newline="") as f:
        labels = [r["label"] for r in csv.DictReader(f)]
    runs: dict[str, dict] = {}
    right: dict[tuple[str, int], list[bool]] = {}
    for seed in seeds:
        for name in setups:
            folder = run_dir(out, name, seed)
            if not (folder / "finetune_results.json").is_file():
                continue
            pred = _predictions(folder)
            if len(pred) != len(labels):
                raise ValueError(f"{folder}: {len(pred)} predictions for {len(labels)} test documents")
            ok = [p == t for p, t in zip(pred, labels)]
            right[(name, seed)] = ok
            res = json.loads((folder / "finetune_results.json").read_text())
            lo, hi = wilson(sum(ok), len(ok))
            recall = {
                c: sum(o for o, t in zip(ok, labels) if t == c) / labels.count(c) for c in sorted(set(labels))
            }
            runs[f"{name}-seed{seed}"] = {
                "run": name, "seed": seed, "tokens_per_document": setups[name][1],
                "test_accuracy": sum(ok) / len(ok), "test_accuracy_ci95": [lo, hi],
                "test_macro_f1": res["test"]["macro_f1"], "validation_accuracy": res["validation"]["accuracy"],
                "recall_by_label": recall, "best_step": res["loop"]["best_step"],
                "train_documents_cut": res.get("truncated", {}).get("train", {}).get("examples", 0),
            }  # fmt: skip
    for (name, seed), ok in right.items():  # paired: the same test documents
        against = [("vs_window_512", baseline)] + [(key, other) for key, run, other in pairs if run == name]
        for key, other in against:
            base = right.get((other, seed))
            if name == other or base is None:
                continue
            only_a = sum(a and not b for a, b in zip(ok, base))
            only_b = sum(b and not a for a, b in zip(ok, base))
            runs[f"{name}-seed{seed}"][key] = {
                "against": other, "accuracy_difference": (sum(ok) - sum(base)) / len(ok), "only_this_right": only_a,
                "only_other_right": only_b, "mcnemar_p": mcnemar_exact(only_a, only_b),
                "bootstrap_ci95": list(paired_bootstrap(ok, base)),
            }  # fmt: skip
    counts = {c: labels.count(c) for c in sorted(set(labels))}
    report = {"test_documents": len(labels), "test_labels": counts, "majority_accuracy": max(counts.values()) / len(labels),
              "settings": {"batch": BATCH, "lr": LR, "epochs": epochs, "precision": PRECISION}, "runs": runs}  # fmt: skip
    folder = out / "genre"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "results.md").write_text(render(report))
    return report


def render(report: dict) -> str:
    lines = [
        f"Brown genre groups, {report['test_documents']} test documents {report['test_labels']}; majority class "
        f"{100 * report['majority_accuracy']:.1f} %. Fine-tuning: batch {report['settings']['batch']}, lr "
        f"{report['settings']['lr']:g}, {report['settings']['epochs']} epochs, {report['settings']['precision']}, best validation step.\n",
        "| run | tokens / document | test accuracy (95 % CI) | macro-F1 | paired comparisons (same documents) |",
        "|---|---:|---|---:|---|",
    ]  # fmt: skip
    for key, r in report["runs"].items():
        lo, hi = r["test_accuracy_ci95"]
        cmps = [(f"vs {vs['against']}: {100 * vs['accuracy_difference']:+.1f} points (bootstrap "
                 f"{100 * vs['bootstrap_ci95'][0]:+.1f} to {100 * vs['bootstrap_ci95'][1]:+.1f}), McNemar p = "
                 f"{vs['mcnemar_p']:.3f} ({vs['only_this_right']} vs {vs['only_other_right']} discordant)")
                for vs in (r.get("vs_window_512"), r.get("vs_first_512_tokens")) if vs]  # fmt: skip
        lines.append(f"| {key} | {r['tokens_per_document']} | {100 * r['test_accuracy']:.1f} % ({100 * lo:.1f}–{100 * hi:.1f}) "
                     f"| {r['test_macro_f1']:.3f} | {'; '.join(cmps) or '—'} |")  # fmt: skip
    return "\n".join(lines) + "\n"
