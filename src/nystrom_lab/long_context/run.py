"""The run class the long-context experiments share (:class:`LongRun`): MiniLM continued on masked-LM over a
corpus, one variant per ``nystrom pretrain`` child process, every variant on the same tokens per step,
learning rate, schedule and dev set. ``nystrom pretrain long-context``
(:class:`~nystrom_lab.long_context.experiment.LongContextRun`) and ``long-positions``
(:class:`~nystrom_lab.long_context.positions.PositionsRun`) add their variants to it.

Legend: N long length (``long_length``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from nystrom_lab.data.records import options_from_record, options_record

R = TypeVar("R", bound="LongRun")


@dataclass(frozen=True)
class LongRun:
    """Options every variant of a long-context experiment gets (its batch holds ``tokens_per_step``)."""

    #: the tag of the experiment's progress lines
    TAG: ClassVar[str] = "long-context"

    corpus: tuple[str, ...]
    out: Path = Path("experiments/long-context")
    long_length: int = 4096
    steps: int = 200
    tokens_per_step: int = 4 * 4096
    lr: float = 1e-4
    warmup: int = 20
    eval_every: int = 25
    dev_fraction: float = 0.05
    dupe_factor: int = 10
    precision: str = "bf16"
    seed: int = 0
    #: every variant's ``--packing`` (nystrom_lab.text.layout): one layout for all, so that they compare
    packing: str = "stream"

    @classmethod
    def from_record(cls: type[R], data: dict) -> R:
        """The run :meth:`record` describes (JSON lists back to tuples, the folder to a Path); a record
        written before ``packing`` was an option describes a stream run."""
        return options_from_record(cls, {"packing": "stream", **data})

    def record(self) -> dict:
        """The options as ``settings.json`` and the report's ``settings`` hold them; ``packing`` only when it
        is not ``stream`` (so a stream run's record reads as it did before the option)."""
        out = options_record(self)
        if out.get("packing") == "stream":
            del out["packing"]
        return out

    def write_settings(self) -> None:
        """``OUT/settings.json``: :meth:`record`."""
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "settings.json").write_text(json.dumps(self.record(), indent=2, sort_keys=True) + "\n")

    def length(self, variant: str) -> int:
        """The tokens per training sequence of ``variant``."""
        raise NotImplementedError

    def model_dir(self, variant: str) -> Path:
        """The folder ``variant`` starts from."""
        return self.out / "models" / variant

    def variant_steps(self, variant: str) -> int:
        """The optimiser steps ``variant`` trains for."""
        return self.steps

    def seed_args(self, variant: str) -> list[str]:
        """The seed options of ``variant``'s run (and any option that is the variant's alone)."""
        return ["--seed", str(self.train_seed(variant))]

    def train_seed(self, variant: str) -> int:
        """The ``--seed`` of ``variant``'s run: its batches, training masks and packed rows."""
        return self.seed

    def layout(self, variant: str) -> str:
        """The ``--packing`` of ``variant``'s run (every variant the experiment's, unless a subclass says)."""
        return self.packing

    def pretrain_args(self, variant: str, *, device: str = "auto") -> list[str]:
        """The ``nystrom pretrain`` arguments that train ``variant`` on ``device``."""
        length = self.length(variant)
        return [
            "pretrain", "--init-from", str(self.model_dir(variant)), "--objective", "mlm",
            "--corpus", *self.corpus, "--out", str(self.out / variant), "--max-length", str(length),
            "--reference-length", str(self.long_length), "--batch-size", str(self.tokens_per_step // length),
            "--steps", str(self.variant_steps(variant)), "--lr", str(self.lr), "--warmup", str(self.warmup),
            "--eval-every", str(self.eval_every), "--eval-batches", "100000", "--eval-at-start",
            "--dev-fraction", str(self.dev_fraction), "--dupe-factor", str(self.dupe_factor),
            "--precision", self.precision, "--device", device, "--packing", self.layout(variant), *self.seed_args(variant),
        ]  # fmt: skip

    def train_in_child(self, variant: str, *, progress: bool = True, device: str = "auto") -> None:
        """Train (or resume) ``variant`` in a ``nystrom pretrain`` child process on ``device``."""
        cmd = [sys.executable, "-m", "nystrom_lab.cli", *self.pretrain_args(variant, device=device)]
        if not progress:
            cmd.append("--no-progress")
        print(f"[{self.TAG}] {variant}: {' '.join(cmd[3:])}", flush=True)
        subprocess.run(cmd, check=True)
