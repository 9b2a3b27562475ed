"""Presets of the text commands, importable without numpy, torch or transformers (the command line checks
its options against them before loading anything heavy): the attention preset of BERT-size models, the
pre-training and fine-tuning presets, and the Figure 5 variants.

Attention specs follow the one grammar of :mod:`nystrom_lab.attention_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: conv skip kernel of the paper's BERT-size models (the released HF checkpoints use 65)
PAPER_CONV_KERNEL = 65
#: what a text command's Nyström spec gets for a key it does not set (the rest: the constructor's defaults)
TEXT_ATTENTION_PRESET: dict[str, dict[str, int]] = {"nystrom": {"conv_kernel_size": PAPER_CONV_KERNEL}}


# ---------------------------------------------------------------- pre-training
WARMUP_FRACTION = 10_000 / 500_000  # the paper's 10k warm-up steps of 0.5M
OBJECTIVES = ("mlm+sop", "mlm")


@dataclass(frozen=True)
class PretrainPreset:
    steps: int
    batch_size: int
    max_length: int
    eval_every: int
    eval_batches: int
    lr: float = 1e-4


PRETRAIN_PRESETS: dict[str, PretrainPreset] = {
    # the paper: batch 256, length 512, 0.5M steps (BERT-base from scratch; 0.25M from standard)
    "paper": PretrainPreset(steps=500_000, batch_size=256, max_length=512, eval_every=10_000, eval_batches=50),
    "quick": PretrainPreset(steps=200, batch_size=16, max_length=128, eval_every=50, eval_batches=4),
    # scaled-down, Figure-6 style (MiniLM init, python-docstrings corpus) on a 2-core CPU; see docs/pretraining.md
    # (Figure 5 from scratch is `nystrom pretrain figure5`)
    "fig5": PretrainPreset(steps=200, batch_size=16, max_length=256, eval_every=20, eval_batches=8),
}


#: the paper's Figure 5 variants, each with its constructor's defaults (Nyström: 64 landmarks, Linformer:
#: projection 256); runs are named by the resolved spec (nystrom-64). Performer is optional (--variants)
FIG5_VARIANTS = ("softmax", "nystrom", "linformer", "linear")


# ---------------------------------------------------------------- fine-tuning
@dataclass(frozen=True)
class FinetunePreset:
    batch_size: int
    lr: float
    epochs: float
    max_length: int  # IMDB: imdb_max_length
    imdb_max_length: int
    max_train_examples: int | None = None
    max_eval_examples: int | None = None


FINETUNE_PRESETS: dict[str, FinetunePreset] = {
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
