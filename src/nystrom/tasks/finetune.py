"""``nystrom finetune TASK``: GLUE (sst2, mrpc, qnli, qqp, mnli) and IMDB fine-tuning (the paper's Table 2).

Legend: b batch, n tokens, c classes.

The paper's settings: batch 32, AdamW lr 3e-5, 4 epochs (MRPC: the best of batch {8, 16, 32} x lr
{2e-5, 3e-5, 4e-5, 5e-5}, :data:`MRPC_GRID`), linear decay after a 10% warm-up (BERT's fine-tuning
recipe; the paper does not state one), weight decay 0.01. The loop keeps the best dev accuracy (one
evaluation per epoch); those weights then predict every dev split (MNLI: matched and mismatched) and
any unlabelled GLUE test file, written as ``predictions_<split>.tsv`` (``index\\tprediction``, GLUE's
submission format), with accuracy and, for MRPC/QQP, F1 of the positive class.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from nystrom.data.glue import (
    FINETUNE_TASKS,
    ClassificationDataset,
    Examples,
    collate_classification,
    load_task,
)
from nystrom.data.text import TextTokenizer, load_tokenizer
from nystrom.model import NystromformerForSequenceClassification
from nystrom.tasks.pretrain import check_eval_batches
from nystrom.tasks.text_models import (
    PAPER_CONV_KERNEL,
    load_config,
    load_source,
    parse_attention,
    save_model_folder,
    transfer,
)
from nystrom.training import Task, TrainConfig, train
from nystrom.training.preflight import check_split

F1_TASKS = ("mrpc", "qqp")
MRPC_GRID = {"batch_size": (8, 16, 32), "lr": (2e-5, 3e-5, 4e-5, 5e-5)}


@dataclass(frozen=True)
class FinetunePreset:
    batch_size: int
    lr: float
    epochs: float
    max_length: int  # IMDB: imdb_max_length
    imdb_max_length: int
    max_train_examples: int | None = None
    max_eval_examples: int | None = None


PRESETS: dict[str, FinetunePreset] = {
    "paper": FinetunePreset(batch_size=32, lr=3e-5, epochs=4, max_length=128, imdb_max_length=512),
    "quick": FinetunePreset(
        batch_size=16,
        lr=5e-5,
        epochs=1,
        max_length=128,
        imdb_max_length=256,
        max_train_examples=2000,
        max_eval_examples=500,
    ),
}


@dataclass(frozen=True)
class FinetuneRun:
    """Options of one ``nystrom finetune`` run; None means "the preset's value"."""

    task: str
    data: Path
    out: Path
    preset: str = "paper"
    init_from_bert: str | None = None
    from_hf: str | None = None
    from_pretrain: str | None = None
    model: str | None = None  # fresh model: preset name or config JSON (no initialisation given)
    tokenizer: Path | None = None
    attention: str | None = None  # None: the source's (BERT: nystrom-64)
    conv_kernel: int | None = PAPER_CONV_KERNEL
    batch_size: int | None = None
    lr: float | None = None
    epochs: float | None = None
    max_length: int | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    dropout: float | None = None
    seed: int = 0
    bf16: bool = False
    select_metric: str = "accuracy"  # dev metric that picks the best step: "accuracy", or "f1" (MRPC, QQP)

    def __post_init__(self) -> None:
        if self.task not in FINETUNE_TASKS:
            raise ValueError(f"task must be one of {FINETUNE_TASKS}, got {self.task!r}")
        allowed = ("accuracy", "f1") if self.task in F1_TASKS else ("accuracy",)
        if self.select_metric not in allowed:
            raise ValueError(
                f"select_metric for {self.task} must be one of {allowed}, got {self.select_metric!r}"
                + ("" if self.task in F1_TASKS else f" (F1 is reported for {', '.join(F1_TASKS)} only)")
            )
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {self.preset!r}")

    def length(self) -> int:
        p = PRESETS[self.preset]
        return self.max_length or (p.imdb_max_length if self.task == "imdb" else p.max_length)

    def train_config(self, num_train: int) -> TrainConfig:
        p = PRESETS[self.preset]
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
            bf16=self.bf16,
            eval_every=min(per_epoch, steps),
            log_every=max(1, min(10, steps // 20)),
            seed=self.seed,
            metric=self.select_metric,
        )


def build_model(
    run: FinetuneRun, num_labels: int
) -> tuple[NystromformerForSequenceClassification, TextTokenizer]:
    """The classifier from the requested initialisation (or fresh), and its tokenizer."""
    spec = parse_attention(run.attention, conv_kernel=run.conv_kernel) if run.attention else None
    sources = (run.init_from_bert, run.from_hf, run.from_pretrain)
    torch.manual_seed(run.seed)
    if any(sources):
        if run.init_from_bert and spec is None:
            spec = parse_attention("nystrom-64", conv_kernel=run.conv_kernel)
        source, beside = load_source(
            init_from_bert=run.init_from_bert, from_hf_path=run.from_hf, from_pretrain=run.from_pretrain,
            attention=spec,
        )  # fmt: skip
        cfg = source.config
    else:
        if run.model is None:
            raise ValueError("give --init-from-bert, --from-hf, --from-pretrain or --model (a fresh model)")
        source, beside = None, None
        cfg = load_config(run.model)
        if spec is not None:
            cfg = cfg.replace(attention=spec)
    tok_path = run.tokenizer or beside
    if tok_path is None:
        raise ValueError("no tokenizer.json beside the initialisation: give --tokenizer PATH")
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


def classification_step(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, tuple[float, int]]]:
    """Cross-entropy, accuracy and the rates of true/false positives and false negatives of class 1
    (F1 = 2tp / (2tp + fp + fn) is a ratio of these, so it survives the loop's per-metric averaging)."""
    out = model(**batch)
    pred, y = out.logits.argmax(-1), batch["labels"]  # (b,), (b,)
    b = int(y.shape[0])
    return out.loss, {
        "accuracy": (float((pred == y).sum()), b),
        "tp": (float(((pred == 1) & (y == 1)).sum()), b),
        "fp": (float(((pred == 1) & (y != 1)).sum()), b),
        "fn": (float(((pred != 1) & (y == 1)).sum()), b),
    }


def classification_f1(means: dict[str, float]) -> dict[str, float]:
    """F1 of class 1 from an evaluation's tp/fp/fn rates (shared denominators cancel; 0 without a tp)."""
    tp, fp, fn = means["tp"], means["fp"], means["fn"]
    return {"f1": 2 * tp / (2 * tp + fp + fn) if tp > 0 else 0.0}


def f1_score(pred: list[int], gold: list[int], *, positive: int = 1) -> float:
    """F1 of class ``positive`` (0.0 when there are no true positives)."""
    tp = sum(p == positive and g == positive for p, g in zip(pred, gold))
    fp = sum(p == positive and g != positive for p, g in zip(pred, gold))
    fn = sum(p != positive and g == positive for p, g in zip(pred, gold))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


@torch.no_grad()
def predict(
    model: nn.Module, data: ClassificationDataset, *, pad_id: int, batch_size: int, bf16: bool
) -> list[int]:
    """Class ids (argmax of the logits (b, c)) for every item of ``data``."""
    was = model.training
    model.eval()
    preds: list[int] = []
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for lo in range(0, len(data), batch_size):
            batch = collate_classification(
                [data[i] for i in range(lo, min(lo + batch_size, len(data)))], pad_id=pad_id
            )
            batch.pop("labels", None)
            preds += model(**batch).logits.argmax(-1).tolist()
    model.train(was)
    return preds


def _split_name(ex: Examples) -> str:
    return ex.name.split("/", 1)[1]


def run_finetune(run: FinetuneRun, *, progress: bool = True) -> dict:
    """Fine-tune and predict; writes ``out/{finetune_results.json, predictions_*.tsv, metrics.jsonl, ...}`` and
    ``out/model/``: the best-dev classifier with its tokenizer and label names, a transformers folder.

    Returns ``{split: {"accuracy", ["f1"], "examples"}}`` for the dev splits (and ``"loop"``: the loop's results).
    """
    splits = load_task(run.data, run.task)
    label_names = splits["train"][0].label_names
    model, tok = build_model(run, len(label_names))
    model.config.id2label = dict(enumerate(label_names))  # pipelines report these names
    model.config.label2id = {name: i for i, name in enumerate(label_names)}
    p = PRESETS[run.preset]
    n_train = run.max_train_examples or p.max_train_examples
    n_eval = run.max_eval_examples or p.max_eval_examples
    length = run.length()
    train_set = ClassificationDataset(splits["train"][0], tok, max_length=length, limit=n_train)
    devs = [ClassificationDataset(e, tok, max_length=length, limit=n_eval) for e in splits["dev"]]
    tests = [ClassificationDataset(e, tok, max_length=length, limit=n_eval) for e in splits["test"]]
    for data in devs + tests:  # before training: these are predicted after it
        check_split(_split_name(data.examples), data)
    pad = tok.pad_id

    def collate(items: list[dict]) -> dict[str, torch.Tensor]:
        return collate_classification(items, pad_id=pad)

    task = Task(
        model, train_set, collate, classification_step, dev=devs[0], name=f"finetune-{run.task}",
        derived=classification_f1 if run.task in F1_TASKS else None,
    )  # fmt: skip
    cfg = run.train_config(len(train_set))
    check_eval_batches(len(devs[0]), cfg)
    loop_results = train(task, cfg, run.out, progress=progress)
    if (dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))) != 0:
        return {"loop": loop_results}
    results: dict = {"loop": loop_results}
    save_model_folder(model, tok.path, run.out / "model")  # the best-dev weights (the loop reloaded them)
    for data in devs + tests:
        preds = predict(model, data, pad_id=pad, batch_size=cfg.batch_size, bf16=run.bf16)
        name = _split_name(data.examples)
        lines = ["index\tprediction"] + [f"{i}\t{label_names[k]}" for i, k in zip(data.index, preds)]
        (run.out / f"predictions_{name}.tsv").write_text("\n".join(lines) + "\n")
        if data.labels is not None:
            res = {"accuracy": sum(int(a == b) for a, b in zip(preds, data.labels)) / len(preds),
                   "examples": len(preds)}  # fmt: skip
            if run.task in F1_TASKS:
                res["f1"] = f1_score(preds, data.labels)
            results[name] = res
    (run.out / "finetune_results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    return results
