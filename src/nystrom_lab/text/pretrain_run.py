"""Options of one ``nystrom pretrain`` run (:class:`PretrainRun`) and the training configuration they give.

Shared by the MLM + SOP path (:mod:`nystrom_lab.text.pretrain`) and the MLM-only path on whole documents
(:mod:`nystrom_lab.text.mlm`); how both lay examples out in rows: :mod:`nystrom_lab.text.layout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nystrom_lab.data.constants import DUPE_FACTOR, SHORT_SEQ_PROB
from nystrom_lab.text.layout import check_layout
from nystrom_lab.text.presets import OBJECTIVES, PRETRAIN_PRESETS, WARMUP_FRACTION
from nystrom_lab.training.config import TrainConfig


@dataclass(frozen=True)
class PretrainRun:
    """Options of one ``nystrom pretrain`` run; None means "the preset's value"."""

    corpus: tuple[str, ...]
    out: Path
    preset: str = "quick"
    tokenizer: Path | None = None
    train_tokenizer: int | None = None  # train a WordPiece of this vocabulary on the corpus
    init_from: str = (
        "bert-small"  # the start point (nystrom_lab.start_point): a configuration draws a fresh model
    )
    attention: str | None = None  # a spec of nystrom_lab.attention_spec; None: the start point's own
    objective: str = "mlm+sop"  # or "mlm": whole documents, MLM only (mlm.py)
    packing: str | None = None  # documents, stream, off (text.layout); None: documents where the model packs
    reference_length: int | None = None  # mlm: dev position buckets of this length (default: max_length)
    gradient_checkpointing: bool = False
    eval_at_start: bool = False
    steps: int | None = None
    batch_size: int | None = None
    max_length: int | None = None
    lr: float | None = None
    warmup: int | None = None
    eval_every: int | None = None
    eval_batches: int | None = None
    dropout: float | None = None
    doc_mode: str = "blank"
    dev_fraction: float = 0.05
    short_seq_prob: float = SHORT_SEQ_PROB
    grad_accum: int = 1
    seed: int = 0
    dev_seed: int | None = None  # mlm: seed of the dev set's fixed masks (None: seed)
    dupe_factor: int = DUPE_FACTOR  # draws of masks / segment order per training pair (dev: one)
    precision: str = "fp32"  # fp32, bf16, fp16 (nystrom_lab.training.device)
    device: str = "auto"
    compile: bool = False
    lr_scale: tuple[tuple[str, float], ...] = ()  # (parameter-name glob, factor): TrainConfig.lr_scale

    def __post_init__(self) -> None:
        if self.preset not in PRETRAIN_PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRETRAIN_PRESETS)}, got {self.preset!r}")
        if not self.corpus:
            raise ValueError("--corpus: give at least one file, folder or built-in corpus name")
        if self.tokenizer is not None and self.train_tokenizer is not None:
            raise ValueError("give --tokenizer or --train-tokenizer, not both")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        check_layout(self.packing, self.objective)
        if self.dev_seed is not None and self.objective != "mlm":
            raise ValueError("--dev-seed applies to --objective mlm only (MLM + SOP draws its dev set from --seed)")

    def train_config(self) -> TrainConfig:
        p = PRETRAIN_PRESETS[self.preset]
        steps = self.steps or p.steps
        warmup = self.warmup if self.warmup is not None else max(1, round(WARMUP_FRACTION * steps))
        return TrainConfig(
            steps=steps,
            batch_size=self.batch_size or p.batch_size,
            lr=self.lr or p.lr,
            warmup=warmup,
            weight_decay=0.01,
            betas=(0.9, 0.999),
            eps=1e-6,
            grad_accum=self.grad_accum,
            clip=1.0,
            precision=self.precision,
            device=self.device,
            compile=self.compile,
            eval_every=min(self.eval_every or p.eval_every, steps),
            eval_at_start=self.eval_at_start,
            eval_batches=self.eval_batches or p.eval_batches,
            log_every=max(1, min(10, steps // 20)),
            seed=self.seed,
            metric="mlm_accuracy",
            lr_scale=self.lr_scale,
        )

    def length(self) -> int:
        return self.max_length or PRETRAIN_PRESETS[self.preset].max_length
