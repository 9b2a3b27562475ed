"""The LRA tasks' facts and schedules: the official per-task protocol and a CPU-sized ``quick`` preset.

Legend: L padded sequence length (per document for retrieval), B batch, c classes, v vocabulary.

Official schedules are those of the Nyströmformer release (mlpen/Nystromformer ``LRA/code/lra_config.py``
and ``run_tasks.py``): AdamW (0.9, 0.999, eps 1e-6, weight decay 0), peak lr 1e-4, linear warm-up then
linear decay, no gradient clipping, dev evaluation every ``eval_every`` steps, the best-dev weights
evaluated once on the full test split.

Attention specs follow the one grammar of :mod:`nystrom_lab.attention_spec`; :data:`ATTENTION_PRESET` adds
the official configuration's conv kernel to a Nyström spec that does not set one.
"""

from __future__ import annotations

from dataclasses import dataclass

from nystrom_lab.data.lra.listops import ListOpsConfig
from nystrom_lab.data.lra.tokenize import BYTE_VOCAB_SIZE, LISTOPS_VOCAB_SIZE, PIXEL_VOCAB_SIZE

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
PRESET_NAMES = ("official", "quick")


@dataclass(frozen=True)
class TaskSpec:
    """What a task is: vocabulary v, classes c, whether it is a two-document task, whether id 0 is padding."""

    vocab_size: int
    num_labels: int
    dual: bool = False
    padded: bool = True  # False for pixels: grey level 0 is a real token, sequences have a fixed length


TASK_SPECS: dict[str, TaskSpec] = {
    "listops": TaskSpec(vocab_size=LISTOPS_VOCAB_SIZE, num_labels=10),
    "text": TaskSpec(vocab_size=BYTE_VOCAB_SIZE, num_labels=2),
    "retrieval": TaskSpec(vocab_size=BYTE_VOCAB_SIZE, num_labels=2, dual=True),
    "image": TaskSpec(vocab_size=PIXEL_VOCAB_SIZE, num_labels=10, padded=False),
    "pathfinder": TaskSpec(vocab_size=PIXEL_VOCAB_SIZE, num_labels=2, padded=False),
}


@dataclass(frozen=True)
class Schedule:
    """One task's protocol: length L, batch B, optimiser steps, warm-up, dev evaluation period, peak lr."""

    max_length: int
    batch_size: int
    steps: int
    warmup: int
    eval_every: int
    lr: float = 1e-4
    clip: float | None = None  # the official script does not clip gradients


SCHEDULES: dict[str, dict[str, Schedule]] = {
    "official": {
        # ListOps sequences are < 2000 symbols; our attention masks padding, so no power-of-two padding
        "listops": Schedule(max_length=2000, batch_size=32, steps=5000, warmup=1000, eval_every=50),
        # the paper's 4K; the released preprocessing script cut IMDB to 1000 bytes (use --max-length 1000)
        "text": Schedule(max_length=4000, batch_size=32, steps=20000, warmup=8000, eval_every=500),
        "retrieval": Schedule(max_length=4000, batch_size=32, steps=30000, warmup=800, eval_every=300),
        "image": Schedule(max_length=1024, batch_size=256, steps=35000, warmup=175, eval_every=175),
        "pathfinder": Schedule(max_length=1024, batch_size=256, steps=62400, warmup=312, eval_every=312),
    },
    # minutes on a 2-core CPU: a smoke test of the whole pipeline, not a reproduction
    "quick": {
        "listops": Schedule(max_length=128, batch_size=32, steps=200, warmup=20, eval_every=50, lr=1e-3),
        "text": Schedule(max_length=512, batch_size=32, steps=200, warmup=20, eval_every=100, lr=1e-3),
        "retrieval": Schedule(max_length=256, batch_size=16, steps=200, warmup=20, eval_every=100, lr=1e-3),
        "image": Schedule(max_length=1024, batch_size=32, steps=200, warmup=20, eval_every=100, lr=1e-3),
        "pathfinder": Schedule(max_length=1024, batch_size=32, steps=200, warmup=20, eval_every=100, lr=1e-3),
    },
}

#: generated ListOps when no --data is given: (train, dev, test) sizes and generator settings per preset
LISTOPS_SIZES: dict[str, tuple[int, int, int]] = {
    "official": (96_000, 2_000, 2_000),
    "quick": (4_000, 500, 500),
}
LISTOPS_GENERATOR: dict[str, ListOpsConfig] = {
    "official": ListOpsConfig(),  # LRA's basic task: 500 < length < 2000
    "quick": ListOpsConfig(min_length=10, max_length=128),  # short trees, ~30 symbols on average
}
LISTOPS_DATA_SEED = 0  # the data set is fixed; --seed changes initialisation and example order only

#: the official LRA configuration's attention options (a key the spec sets wins; the rest are
#: NystromAttention's defaults, :mod:`nystrom_lab.attention_spec`)
ATTENTION_PRESET: dict[str, dict[str, int]] = {"nystrom": {"conv_kernel_size": 35}}

#: what each task needs under --data, and where it comes from (for the missing-data error)
DATA_SOURCES: dict[str, tuple[tuple[str, ...], str]] = {
    "listops": (
        ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"),
        "the LRA release (lra_release/listops-1000/, https://storage.googleapis.com/long-range-arena/"
        "lra_release.gz), or `nystrom data listops DIR`; without --data ListOps is generated into OUT/data",
    ),
    "text": (
        ("train/neg/*.txt", "train/pos/*.txt", "test/neg/*.txt", "test/pos/*.txt"),
        "the IMDB reviews folder aclImdb/ from https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
    ),
    "retrieval": (
        ("new_aan_pairs.train.tsv", "new_aan_pairs.eval.tsv", "new_aan_pairs.test.tsv"),
        "the LRA release folder lra_release/tsv_data/ (https://storage.googleapis.com/long-range-arena/"
        "lra_release.gz)",
    ),
    "image": (
        ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"),
        "the CIFAR-10 python pickles (the folder cifar-10-batches-py/ inside "
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz)",
    ),
    "pathfinder": (
        ("curv_contour_length_14/metadata/*.npy", "curv_contour_length_14/imgs/<batch>/sample_<i>.png"),
        "the LRA release folder lra_release/pathfinder32/ (https://storage.googleapis.com/long-range-arena/"
        "lra_release.gz), or `nystrom data pathfinder DIR --difficulty 14 --count 200000`",
    ),
}


def schedule(task: str, preset: str) -> Schedule:
    """The schedule of ``task`` under ``preset`` ("official" or "quick")."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if preset not in SCHEDULES:
        raise ValueError(f"preset must be one of {PRESET_NAMES}, got {preset!r}")
    return SCHEDULES[preset][task]
