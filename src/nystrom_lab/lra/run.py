"""The options of one LRA run (:class:`LRARun`) and what they resolve to: schedule, model config, model.

Legend: L padded length (per document for retrieval), e hidden size (64), c classes.

``None`` in an option means "the preset's value" (:mod:`nystrom_lab.lra.presets`); the functions here
apply the run's overrides to the preset. Data loading and the run itself are in :mod:`nystrom_lab.lra.experiment`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from nystrom.model import (
    NystromformerConfig,
    NystromformerForDualSequenceClassification,
    NystromformerForSequenceClassification,
)
from nystrom_lab import attention_spec
from nystrom_lab.data.lra.tokenize import PAD_ID
from nystrom_lab.lra.presets import ATTENTION_PRESET, PRESET_NAMES, TASK_SPECS, TASKS, schedule
from nystrom_lab.training import TrainConfig


@dataclass(frozen=True)
class LRARun:
    """Options of one ``nystrom lra`` run; ``None`` means "the preset's value"."""

    task: str
    attention: str = "nystrom"  # a spec of nystrom_lab.attention_spec
    preset: str = "official"
    data: Path | None = None
    out: Path | None = None
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    max_length: int | None = None
    eval_batches: int | None = None
    eval_every: int | None = None
    seed: int = 0
    precision: str = "fp32"  # fp32, bf16, fp16 (nystrom_lab.training.device)
    device: str = "auto"
    compile: bool = False
    pool_padding: bool = False
    listops_sizes: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.preset not in PRESET_NAMES:
            raise ValueError(f"preset must be one of {PRESET_NAMES}, got {self.preset!r}")
        if self.listops_sizes is not None and self.task != "listops":
            raise ValueError("listops_sizes (--listops-sizes) only applies to the listops task")
        if self.listops_sizes is not None and self.data is not None:
            raise ValueError("listops_sizes (--listops-sizes) sizes generated data; it cannot go with --data")

    def length(self) -> int:
        return self.max_length or schedule(self.task, self.preset).max_length

    def out_dir(self) -> Path:
        if self.out is not None:
            return Path(self.out)
        label = attention_spec.label(self.attention)
        return Path("runs") / "lra" / f"{self.task}-{label}-{self.preset}-seed{self.seed}"


def train_config(run: LRARun) -> TrainConfig:
    """The preset's schedule with the run's overrides; ``--steps`` scales the warm-up proportionally."""
    s = schedule(run.task, run.preset)
    steps = run.steps or s.steps
    warmup = s.warmup if run.steps is None else round(s.warmup * steps / s.steps)
    return TrainConfig(
        steps=steps,
        batch_size=run.batch_size or s.batch_size,
        lr=run.lr or s.lr,
        warmup=warmup,
        weight_decay=0.0,
        betas=(0.9, 0.999),
        eps=1e-6,
        clip=s.clip,
        precision=run.precision,
        device=run.device,
        compile=run.compile,
        eval_every=min(run.eval_every or s.eval_every, steps),
        eval_batches=run.eval_batches,
        log_every=max(1, min(10, steps // 10)),
        seed=run.seed,
    )


def model_config(run: LRARun) -> NystromformerConfig:
    """The ``"lra"`` preset for this task: vocabulary, classes, length L, attention and pooling."""
    spec = TASK_SPECS[run.task]
    return NystromformerConfig.preset(
        "lra",
        vocab_size=spec.vocab_size,
        num_labels=spec.num_labels,
        max_position_embeddings=run.length(),
        pad_token_id=PAD_ID if spec.padded else None,  # grey level 0 must keep a trainable embedding
        pooling="mean_with_padding" if run.pool_padding else "mean",
        attention=attention_spec.resolve(run.attention, preset=ATTENTION_PRESET, max_length=run.length()),
    )


def build_model(run: LRARun) -> nn.Module:
    """The dual encoder for retrieval, the single-sequence classifier otherwise (seeded by ``run.seed``)."""
    cfg = model_config(run)
    torch.manual_seed(run.seed)
    cls = (
        NystromformerForDualSequenceClassification
        if TASK_SPECS[run.task].dual
        else NystromformerForSequenceClassification
    )
    try:
        return cls(cfg)
    except (ValueError, TypeError) as err:
        raise type(err)(f"--attention {run.attention}: {err}") from err
