"""Presets and option grammars of the text commands, importable without numpy, torch or transformers
(the command line checks its options against them before loading anything heavy).

Attention specs (``nystrom-64``, ``softmax``, ``linear``, ``linformer-256``, ``performer-256``), the
pre-training and fine-tuning presets, and the Figure 5 variants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: conv skip kernel of the paper's BERT-size models (the released HF checkpoints use 65)
PAPER_CONV_KERNEL = 65
_SPEC = re.compile(r"^(nystrom|linformer|performer)-([0-9]+)$|^(softmax|linear)$")
#: spec name -> the option its number sets
_NUMBERED = {"nystrom": "num_landmarks", "linformer": "proj_len", "performer": "num_features"}


def parse_attention(
    spec: str, *, conv_kernel: int | None = PAPER_CONV_KERNEL, max_seq_len: int | None = None
) -> dict[str, Any]:
    """``"nystrom-64"`` -> Nyström with 64 landmarks (and the depthwise conv skip of ``conv_kernel``
    taps, None = none); ``"softmax"`` -> exact attention; ``"linear"`` -> ELU linear attention;
    ``"linformer-256"`` -> Linformer with projection length 256 (needs ``max_seq_len``, the longest
    input); ``"performer-256"`` -> Performer with 256 random features. Only Nyström gets the conv skip
    (it is part of the paper's method, not of the baselines)."""
    match = _SPEC.match(spec) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(
            "--attention must be nystrom-<landmarks> (e.g. nystrom-64), softmax, linear, linformer-<k> or"
            f" performer-<features>, got {spec!r}"
        )
    if match.group(3):
        return {"name": match.group(3)}
    name, number = match.group(1), int(match.group(2))
    if number < 1:
        raise ValueError(f"--attention {spec}: the number ({_NUMBERED[name]}) must be >= 1")
    out: dict[str, Any] = {"name": name, _NUMBERED[name]: number}
    if name == "nystrom":
        out["conv_kernel_size"] = conv_kernel
    elif name == "linformer":
        if max_seq_len is None:
            raise ValueError(f"--attention {spec}: Linformer needs the sequence length (max_seq_len)")
        out["max_seq_len"] = max_seq_len
    return out


# ---------------------------------------------------------------- pre-training
WARMUP_FRACTION = 10_000 / 500_000  # the paper's 10k warm-up steps of 0.5M
OBJECTIVES = ("mlm+sop", "mlm")


@dataclass(frozen=True)
class PretrainPreset:
    steps: int
    batch_size: int
    seq_len: int
    eval_every: int
    eval_batches: int
    lr: float = 1e-4


PRETRAIN_PRESETS: dict[str, PretrainPreset] = {
    # the paper: batch 256, length 512, 0.5M steps (BERT-base from scratch; 0.25M from standard)
    "paper": PretrainPreset(steps=500_000, batch_size=256, seq_len=512, eval_every=10_000, eval_batches=50),
    "quick": PretrainPreset(steps=200, batch_size=16, seq_len=128, eval_every=50, eval_batches=4),
    # scaled-down, Figure-6 style (MiniLM init, python-docstrings corpus) on a 2-core CPU; see docs/pretraining.md
    # (Figure 5 from scratch is `nystrom pretrain compare`)
    "fig5": PretrainPreset(steps=200, batch_size=16, seq_len=256, eval_every=20, eval_batches=8),
}


#: the paper's Figure 5 variants (Performer is optional: add it with --variants)
FIG5_VARIANTS = ("softmax", "nystrom-64", "linformer-256", "linear")


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
