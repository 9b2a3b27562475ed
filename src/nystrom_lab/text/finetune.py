"""``nystrom finetune``: sequence classification and regression on the user's files or GLUE / IMDB.

Legend: b batch, n tokens, c classes.

Data: ``--train-file`` (CSV, TSV or JSONL; :mod:`nystrom_lab.data.tables`) with optional
``--validation-file`` / ``--test-file``, or a GLUE task / IMDB folder (``TASK --data DIR``); both become
the same :class:`~nystrom_lab.data.glue.Examples` and go through one path. Rows: one example per row,
padded per batch; a sequence label belongs to one row, so fine-tuning does not pack documents
(pre-training does: :mod:`nystrom_lab.text.layout`). Labels follow transformers'
``problem_type``: class names (``id2label``), regression, multi-label; the loss and the metrics fit
(:mod:`nystrom_lab.training.metrics`), and ``--metric`` picks the dev metric that selects the best step.

The paper's settings (GLUE/IMDB, preset ``paper``): batch 32, AdamW lr 3e-5, 4 epochs (MRPC: the best of
batch {8, 16, 32} x lr {2e-5, 3e-5, 4e-5, 5e-5}, :data:`MRPC_GRID`), linear decay after a 10% warm-up,
weight decay 0.01. The loop keeps the best dev weights (one evaluation per epoch); they predict every
dev/test split, written as ``predictions_<split>.tsv`` (``index\tprediction``, GLUE's submission format),
and are saved with the tokenizer and label names as ``OUT/model`` (``nystrom predict OUT/model``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nystrom.model import NystromformerForSequenceClassification
from nystrom_lab.data.glue import (
    FINETUNE_TASKS,
    ClassificationDataset,
    Examples,
    collate_classification,
    load_task,
)
from nystrom_lab.data.tables import PROBLEM_TYPES, LabelSpec, infer_labels, read_table, table_examples
from nystrom_lab.data.text import TextTokenizer, load_tokenizer
from nystrom_lab.text.models import load_start, transfer
from nystrom_lab.text.predict import decode, predict_logits, prediction_text, save_classifier
from nystrom_lab.text.presets import FINETUNE_PRESETS
from nystrom_lab.text.pretrain import check_eval_batches
from nystrom_lab.training import Task, TrainConfig, train
from nystrom_lab.training.metrics import DEFAULT_METRIC, MINIMISED, check_metric, task_metrics
from nystrom_lab.training.preflight import check_split

MRPC_GRID = {"batch_size": (8, 16, 32), "lr": (2e-5, 3e-5, 4e-5, 5e-5)}


@dataclass(frozen=True)
class FinetuneRun:
    """Options of one ``nystrom finetune`` run; None means "the preset's value" (or "none").

    Model: the start point ``init_from`` (:mod:`nystrom_lab.start_point`; default the installed
    all-MiniLM-L6-v2) with ``attention`` (a spec; None: the start point's own).
    Data: ``task`` + ``data`` (GLUE / IMDB), or ``train_file`` (+ ``validation_file``, ``test_file``)
    with ``text_column``, ``text_pair_column`` and ``label_column``. ``problem_type`` None infers it from
    the training labels; ``metric`` None takes the problem type's default (accuracy, macro_f1, pearson).
    """

    out: Path
    task: str | None = None
    data: Path | None = None
    train_file: Path | None = None
    validation_file: Path | None = None
    test_file: Path | None = None
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    problem_type: str | None = None
    preset: str = "paper"
    init_from: str = "minilm"
    tokenizer: Path | None = None
    attention: str | None = None  # None: the start point's own (a BERT folder's: nystrom)
    batch_size: int | None = None
    lr: float | None = None
    epochs: float | None = None
    max_length: int | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    dropout: float | None = None
    seed: int = 0
    precision: str = "fp32"
    device: str = "auto"
    compile: bool = False
    metric: str | None = None  # dev metric that picks the best step (training.metrics)

    def __post_init__(self) -> None:
        if (self.task is None) == (self.train_file is None):
            raise ValueError("give either --train-file FILE or a GLUE/IMDB task with --data DIR")
        if self.task is not None:
            if self.task not in FINETUNE_TASKS:
                raise ValueError(f"task must be one of {FINETUNE_TASKS}, got {self.task!r}")
            if self.data is None:
                raise ValueError(f"finetune {self.task}: give --data DIR (the GLUE root or aclImdb/)")
            if self.validation_file or self.test_file:
                raise ValueError("--validation-file/--test-file go with --train-file, not with a GLUE/IMDB task")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"--problem-type must be one of {PROBLEM_TYPES}, got {self.problem_type!r}")
        if self.preset not in FINETUNE_PRESETS:
            raise ValueError(f"preset must be one of {sorted(FINETUNE_PRESETS)}, got {self.preset!r}")

    def length(self) -> int:
        p = FINETUNE_PRESETS[self.preset]
        return self.max_length or (p.imdb_max_length if self.task == "imdb" else p.max_length)

    def train_config(self, num_train: int, *, metric: str) -> TrainConfig:
        p = FINETUNE_PRESETS[self.preset]
        batch = self.batch_size or p.batch_size
        per_epoch = math.ceil(num_train / batch)
        steps = max(1, math.ceil((self.epochs or p.epochs) * per_epoch))
        return TrainConfig(
            steps=steps,
            batch_size=batch,
            lr=self.lr or p.lr,
            warmup=round(0.1 * steps),
            weight_decay=0.01,
            eps=1e-6,
            clip=1.0,
            precision=self.precision,
            device=self.device,
            compile=self.compile,
            eval_every=min(per_epoch, steps),
            log_every=max(1, min(10, steps // 20)),
            seed=self.seed,
            metric=metric,
            metric_mode="min" if metric in MINIMISED else "max",
        )


def build_model(
    run: FinetuneRun, num_labels: int
) -> tuple[NystromformerForSequenceClassification, TextTokenizer]:
    """The classifier from the ``--init-from`` start point (a configuration: drawn fresh), and its tokenizer."""
    torch.manual_seed(run.seed)
    start = load_start(run.init_from, attention=run.attention, max_length=run.length())
    source, cfg = start.model, start.config
    tok_path = run.tokenizer or start.tokenizer
    if tok_path is None:
        raise ValueError("no tokenizer.json beside the --init-from start point: give --tokenizer PATH")
    tok = load_tokenizer(tok_path)
    if source is None:
        cfg = cfg.replace(vocab_size=max(cfg.vocab_size, tok.vocab_size), pad_token_id=tok.pad_id)
    elif tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"tokenizer {tok.path} has {tok.vocab_size} ids but the model only {cfg.vocab_size}")
    if run.length() > cfg.max_position_embeddings:
        raise ValueError(
            f"--max-length {run.length()} exceeds the model's {cfg.max_position_embeddings} positions"
        )
    cfg = cfg.replace(
        num_labels=num_labels,
        pooling="pooler" if cfg.pooler else "cls",
        classifier_hidden=cfg.hidden_size,
        dropout=cfg.dropout if run.dropout is None else run.dropout,
    )
    cls = NystromformerForSequenceClassification
    return (transfer(source, cls, cfg) if source is not None else cls(cfg)), tok


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, problem_type: str) -> torch.Tensor:
    """transformers' loss for ``problem_type``: cross-entropy, MSE (regression) or BCE-with-logits
    (multi-label); logits (b, c), labels (b,) ids, (b,) floats or (b, c) multi-hot."""
    if problem_type == "regression":
        return F.mse_loss(logits.float().squeeze(-1), labels.float())
    if problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


def make_step(problem_type: str):
    """The loop's step: the loss, and the logits and labels of every example (collected for the metrics,
    which need the whole split: macro-F1, Matthews, Spearman)."""

    def step(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        labels = batch["labels"]
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits  # (b, c)
        return classification_loss(logits, labels, problem_type), {"logits": logits.detach().float(), "labels": labels}

    return step


def load_splits(run: FinetuneRun) -> tuple[dict[str, list[Examples]], LabelSpec]:
    """``{"train": [..], "dev": [..], "test": [..]}`` and the labels, from the run's files or GLUE/IMDB task."""
    if run.task is not None:
        splits = load_task(run.data, run.task)
        return splits, LabelSpec("single_label_classification", splits["train"][0].label_names)
    cols = dict(text_column=run.text_column, text_pair_column=run.text_pair_column, label_column=run.label_column)
    train_table = read_table(run.train_file)
    train_table.require(run.text_column, run.text_pair_column, run.label_column)
    labels = infer_labels(train_table, run.label_column, run.problem_type)
    out: dict[str, list[Examples]] = {"train": [table_examples(train_table, **cols, labels=labels, name="file/train")]}
    for split, path in (("dev", run.validation_file), ("test", run.test_file)):
        name = "validation" if split == "dev" else "test"
        if path is None:
            out[split] = []
            continue
        table = read_table(path)
        table.require(run.text_column, run.text_pair_column, run.label_column if split == "dev" else None)
        out[split] = [table_examples(table, **cols, labels=labels, name=f"file/{name}")]
    return out, labels


def _split_name(ex: Examples) -> str:
    return ex.name.split("/", 1)[1]


def run_finetune(run: FinetuneRun, *, progress: bool = True) -> dict:
    """Fine-tune, save ``out/model`` and predict; writes ``out/{finetune_results.json, predictions_*.tsv,
    metrics.jsonl, ...}``. Returns ``{split: {metrics..., "examples"}}`` for the labelled dev/test splits
    (and ``"loop"``: the loop's results)."""
    splits, labels = load_splits(run)
    metric = run.metric or DEFAULT_METRIC[labels.problem_type]
    check_metric(metric, labels.problem_type, labels.num_labels)
    model, tok = build_model(run, labels.num_labels)
    model.config.problem_type = labels.problem_type  # transformers' loss and pipeline follow it
    if labels.names:  # pipelines and `nystrom predict` report these names
        model.config.id2label = dict(enumerate(labels.names))
        model.config.label2id = {name: i for i, name in enumerate(labels.names)}
    p = FINETUNE_PRESETS[run.preset]
    n_train = run.max_train_examples or p.max_train_examples
    n_eval = run.max_eval_examples or p.max_eval_examples
    length = run.length()
    train_set = ClassificationDataset(splits["train"][0], tok, max_length=length, limit=n_train)
    devs = [ClassificationDataset(e, tok, max_length=length, limit=n_eval) for e in splits["dev"]]
    tests = [ClassificationDataset(e, tok, max_length=length, limit=n_eval) for e in splits["test"]]
    for data in devs + tests:  # before training: these are predicted after it
        check_split(_split_name(data.examples), data)
    truncation = {}
    for name, data in [("train", train_set), *((_split_name(d.examples), d) for d in devs + tests)]:
        note = data.truncation_note(name)
        if note:
            print(f"[nystrom] {note}")
            truncation[name] = {"examples": data.truncated, "of": len(data), "tokens_dropped": data.tokens_dropped}
    pad = tok.pad_id

    def collate(items: list[dict]) -> dict[str, torch.Tensor]:
        return collate_classification(items, pad_id=pad)

    def finalize(rows: dict[str, torch.Tensor]) -> dict[str, float]:
        return task_metrics(labels.problem_type, rows["logits"], rows["labels"])

    name = run.task or Path(run.train_file).stem
    task = Task(
        model, train_set, collate, make_step(labels.problem_type), dev=devs[0] if devs else None,
        name=f"finetune-{name}", finalize=finalize, layout="off",  # a sequence label per row: no packing
    )  # fmt: skip
    cfg = run.train_config(len(train_set), metric=metric)
    if devs:
        check_eval_batches(len(devs[0]), cfg)
    loop_results = train(task, cfg, run.out, progress=progress)
    if (dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))) != 0:
        return {"loop": loop_results}
    results: dict = {"loop": loop_results, "truncated": truncation}
    save_classifier(model, tok, labels, max_length=length, folder=run.out / "model")  # best-dev weights
    for data in devs + tests:
        logits = predict_logits(model, data, pad_id=pad, batch_size=cfg.batch_size, precision=run.precision)
        split = _split_name(data.examples)
        preds = [prediction_text(r) for r in decode(logits, labels)]
        lines = ["index\tprediction"] + [f"{i}\t{p}" for i, p in zip(data.index, preds)]
        (run.out / f"predictions_{split}.tsv").write_text("\n".join(lines) + "\n")
        if data.labels is not None:
            gold = torch.stack([data[i]["labels"] for i in range(len(data))])
            results[split] = task_metrics(labels.problem_type, logits, gold) | {"examples": len(data)}
    (run.out / "finetune_results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    return results
