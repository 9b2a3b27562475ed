"""The genre stage of ``nystrom pretrain long-positions``: the best long Nyström model on
whole Brown documents against ``window-512-continued`` on their first 512 tokens, over several seeds.

The runs are those of :mod:`nystrom_lab.long_context.genre` (same tables, batch, rate, precision and paired
tests), with more epochs (:data:`GENRE_EPOCHS`: 3 left the press class unlearned by every model) and three
seeds; ``{best}-first512`` (the same model on the first 512 tokens) separates the length from the model.
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.long_context.positions import CONTINUED, NYSTROM_ATTENTIONS, PositionsRun, split_variant

GENRE_SEEDS = (0, 1, 2)
GENRE_EPOCHS = 8


def best_long(run: PositionsRun) -> str:
    """The finished long Nyström variant with the highest final dev MLM accuracy (from results.json)."""
    import json

    path = run.out / "results.json"
    variants = json.loads(path.read_text())["variants"] if path.is_file() else {}
    long = {
        name: v["final_mlm_acc"] for name, v in variants.items()
        if name not in (CONTINUED, "source") and v.get("finished") and split_variant(name)[1] in NYSTROM_ATTENTIONS
    }  # fmt: skip
    if not long:
        raise FileNotFoundError(
            f"{path}: no long Nyström variant has finished training (stage train, then report)"
        )
    return max(long, key=long.get)


def setups(best: str) -> dict[str, tuple[str, int]]:
    """Run name -> (pre-trained variant, tokens per document)."""
    return {CONTINUED: (CONTINUED, 512), best: (best, 4096), f"{best}-first512": (best, 512)}


def run_genre(
    run: PositionsRun, genres: Path, *, seeds: tuple[int, ...] = GENRE_SEEDS, epochs: int = GENRE_EPOCHS,
    device: str = "auto", train: bool = True,
) -> dict[str, dict]:  # fmt: skip
    """Fine-tune (resumably) and report; returns results.json's ``genre``: run -> ``test_acc`` (one per seed),
    ``press_recall`` (one per seed) and the paired comparisons of each seed."""
    from nystrom_lab.long_context.genre import genre_report, train_genre

    best = best_long(run)
    runs = setups(best)
    if train:
        train_genre(run.out, genres, seeds=seeds, runs=runs, epochs=epochs, device=device)
    pairs = (("vs_first_512_tokens", best, f"{best}-first512"),)
    report = genre_report(
        run.out, genres, seeds=seeds, setups=runs, baseline=CONTINUED, pairs=pairs, epochs=epochs
    )
    out: dict[str, dict] = {}
    for name in runs:
        done = [r for r in report["runs"].values() if r["run"] == name]
        if done:
            out[name] = {
                "seeds": [r["seed"] for r in done], "test_acc": [r["test_accuracy"] for r in done],
                "press_recall": [r["recall_by_label"].get("press", 0.0) for r in done],
                "vs_window_512": [r.get("vs_window_512") for r in done], "epochs": epochs,
            }  # fmt: skip
    return out
