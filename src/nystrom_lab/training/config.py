"""Training configuration shared by pretraining, fine-tuning and LRA."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from nystrom_lab.training.device import PRECISIONS

#: options that say where a run computes, not what it computes: a run may resume with others
RUNTIME_FIELDS = ("device", "compile")


@dataclass(frozen=True)
class TrainConfig:
    """Everything the shared loop needs besides the model and the data.

    Step counts are optimiser steps; one step consumes ``batch_size`` examples in total across
    ``grad_accum`` micro-batches and all DDP processes.
    """

    steps: int
    batch_size: int
    lr: float = 1e-4
    warmup: int = 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    grad_accum: int = 1
    clip: float | None = 1.0
    precision: str = "fp32"  # fp32, bf16 or fp16 (autocast; fp16 with a GradScaler)
    device: str = "auto"  # auto, cpu, cuda, cuda:N, mps (nystrom_lab.training.device.resolve_device)
    compile: bool = False  # torch.compile the model for training
    eval_every: int = 100
    eval_at_start: bool = False  # also evaluate the initial weights (logged as step 0)
    eval_batches: int | None = None
    eval_batch_size: int | None = None
    checkpoint_every: int | None = None
    log_every: int = 10
    seed: int = 0
    metric: str = "accuracy"
    metric_mode: str = "max"
    #: (glob over parameter names, factor) pairs: a matching parameter's peak rate is ``lr · factor`` (the
    #: first match wins), e.g. (("*lm_head*", 10.0),) trains a fresh head faster than a pretrained body
    lr_scale: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {PRECISIONS}, got {self.precision!r}")
        for name in ("steps", "batch_size", "grad_accum", "eval_every", "log_every"):
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {val!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"TrainConfig.warmup must be an int >= 0, got {self.warmup!r}")
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"TrainConfig.batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum})"
            )
        if not self.lr > 0:
            raise ValueError(f"TrainConfig.lr must be > 0, got {self.lr!r}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"TrainConfig.clip must be > 0 or None, got {self.clip!r}")
        if self.metric_mode not in ("max", "min"):
            raise ValueError(f"TrainConfig.metric_mode must be 'max' or 'min', got {self.metric_mode!r}")
        for pair in self.lr_scale:
            ok = isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and pair[0]
            if (
                not ok
                or isinstance(pair[1], bool)
                or not isinstance(pair[1], (int, float))
                or not pair[1] > 0
            ):
                raise ValueError(
                    f"TrainConfig.lr_scale must hold (parameter-name glob, factor > 0) pairs, got {pair!r}"
                )
        for name in ("eval_batches", "eval_batch_size", "checkpoint_every"):
            val = getattr(self, name)
            if val is not None and (not isinstance(val, int) or val < 1):
                raise ValueError(f"TrainConfig.{name} must be a positive int or None, got {val!r}")

    @property
    def ckpt_every(self) -> int:
        return self.checkpoint_every or self.eval_every

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_json())

    def resumable_dict(self) -> dict:
        """The options a resumed run must share with the checkpoint (all but :data:`RUNTIME_FIELDS`)."""
        return {k: v for k, v in json.loads(self.to_json()).items() if k not in RUNTIME_FIELDS}

    @staticmethod
    def upgrade(data: dict) -> dict:
        """A config dict of an older version in today's fields (``bf16: true`` -> ``precision: "bf16"``)."""
        data = dict(data)
        if "bf16" in data:
            data.setdefault("precision", "bf16" if data.pop("bf16") else "fp32")
        data.setdefault("eval_at_start", False)  # added later; older runs never evaluated step 0
        data.setdefault("lr_scale", [])  # added later; older runs trained every parameter at one rate
        return data

    @classmethod
    def load(cls, path: Path) -> TrainConfig:
        data = cls.upgrade(json.loads(Path(path).read_text()))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown TrainConfig keys {unknown}")
        if "betas" in data:
            data["betas"] = tuple(data["betas"])
        data["lr_scale"] = tuple((str(g), f) for g, f in data.get("lr_scale", ()))
        return cls(**data)
