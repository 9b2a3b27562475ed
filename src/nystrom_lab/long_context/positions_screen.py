"""The step-0 screen of ``nystrom pretrain long-positions``: every position scheme × attention, converted from
the trained source and scored on the dev set without any training (minutes, not hours).

Legend: L source length, N long length, B position buckets of the N-token layout.

Each variant is scored like a training run's step-0 evaluation: the same dev stream, the same fixed masks
(the source's seed), bf16 autocast, accuracy overall and per bucket ([0, 512), [512, 1024), ...). The
source itself is scored on L-token windows of the same tokens (``source-512``). One JSON per variant in
``OUT/screen/`` (a re-run skips the finished ones); :func:`read_screen` gathers them.
"""

from __future__ import annotations

import json
import os
import time

from nystrom_lab.long_context.positions import (
    ATTENTIONS,
    SCHEMES,
    SOURCE,
    PositionsRun,
    build_long,
    variant_name,
)
from nystrom_lab.long_context.report import _by_bucket

SOURCE_WINDOWS = "source-512"  # the source on L-token windows: what every variant is compared with


def screened_variants() -> tuple[str, ...]:
    return tuple(variant_name(s, a) for s in SCHEMES for a in ATTENTIONS)


def summary(metrics: dict) -> dict:
    """The results.json entry of one evaluation: overall and per-bucket accuracy, and the loss."""
    return {"mlm_acc": metrics["mlm_accuracy"], "mlm_acc_by_bucket": _by_bucket(metrics, "mlm_accuracy"),
            "mlm_loss": metrics["mlm_loss"]}  # fmt: skip


class Scorer:
    """Scores MLM models on the run's dev set at a given length (the data built once per length)."""

    def __init__(self, run: PositionsRun) -> None:
        from nystrom_lab.data.text import build_token_cache, load_tokenizer
        from nystrom_lab.data.text_corpus import resolve_corpus

        self.run = run
        if not (run.out / SOURCE / "model" / "config.json").is_file():
            raise FileNotFoundError(
                f"{run.out / SOURCE / 'model'} not found: the screen converts the trained source (results are"
                " committed, weights are not); run the source stage first (`--stages source screen`)"
            )
        self.tok = load_tokenizer(run.out / SOURCE / "model" / "tokenizer.json")
        files = resolve_corpus(list(run.corpus), run.out / "cache")
        self.cache = build_token_cache(files, self.tok, run.out / "cache" / "tokens", doc_mode="blank")
        self._dev: dict[int, object] = {}

    def dev(self, length: int):
        from nystrom_lab.data.text_mlm import PackedMLMDataset

        if length not in self._dev:
            self._dev[length] = PackedMLMDataset(
                self.cache, self.tok, split="dev", seq_len=length, dev_fraction=self.run.dev_fraction,
                seed=self.run.seed, fixed_masks=True, reference_length=self.run.long_length,
            )  # fmt: skip
        return self._dev[length]

    def score(self, model, length: int) -> dict:
        """``model`` (a NystromformerForMaskedLM) on the dev set cut into ``length``-token pieces."""
        from nystrom_lab.data.text_mlm import collate_mlm, position_buckets
        from nystrom_lab.text.mlm import MaskedLMObjective, make_mlm_step
        from nystrom_lab.training import Task, TrainConfig
        from nystrom_lab.training.evaluate import evaluate

        edges = position_buckets(self.run.long_length)
        objective = MaskedLMObjective(model, edges=edges)
        pad = self.tok.pad_id
        task = Task(
            objective, [], lambda items: collate_mlm(items, pad_id=pad, pad_to=length), make_mlm_step(edges)
        )
        cfg = TrainConfig(
            steps=1, batch_size=self.run.tokens_per_step // length, precision=self.run.precision
        )
        return evaluate(task, objective, self.dev(length), cfg, full=True)


def screen(
    run: PositionsRun, variants: tuple[str, ...] | None = None, *, progress: bool = True
) -> dict[str, dict]:
    """Score the source on L-token windows and every variant at N (each once; finished ones are read back).
    Returns ``{variant: summary}``, ``source-512`` included."""
    import torch

    from nystrom.model import NystromformerForMaskedLM

    folder = run.out / "screen"
    folder.mkdir(parents=True, exist_ok=True)
    todo = [SOURCE_WINDOWS, *(variants or screened_variants())]
    scorer = None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc="step-0 screen", unit="variant", dynamic_ncols=True)
    for name in todo:
        path = folder / f"{name}.json"
        if not path.is_file():
            scorer = scorer or Scorer(run)
            torch.manual_seed(run.seed)
            t = time.perf_counter()
            if name == SOURCE_WINDOWS:
                model = NystromformerForMaskedLM.from_pretrained(run.out / SOURCE / "model").eval()
                metrics = scorer.score(model, run.source_length)
            else:
                model = build_long(run, name)
                metrics = scorer.score(model, run.long_length)
            entry = {**summary(metrics), "eval_s": time.perf_counter() - t, "metrics": metrics}
            tmp = path.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps(entry, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, path)
            if bar is not None:
                bar.set_postfix(last=f"{name} {entry['mlm_acc']:.4f}")
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return read_screen(run)


def read_screen(run: PositionsRun) -> dict[str, dict]:
    """The finished screen entries, ``{variant: summary}``, the source's first."""
    folder = run.out / "screen"
    out = {}
    for name in (SOURCE_WINDOWS, *screened_variants()):
        path = folder / f"{name}.json"
        if path.is_file():
            entry = json.loads(path.read_text())
            out[name] = {k: entry[k] for k in ("mlm_acc", "mlm_acc_by_bucket", "mlm_loss")}
    return out
