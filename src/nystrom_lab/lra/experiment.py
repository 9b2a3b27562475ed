"""The paper's Long Range Arena experiments (Table 3) on the shared training loop.

Legend: b batch, L padded length (per document for retrieval), e hidden size (64), c classes.

:func:`run_lra` builds the paper's model (the ``"lra"`` preset: 2 pre-LN layers, e=64, FFN 128, 2 heads,
mean pooling over real tokens) with the requested attention, loads the task's data from the release
formats (or generates ListOps), trains with :func:`nystrom_lab.training.train` (which resumes from
``out/last``) and evaluates the best-dev weights once on the *full* test split. The run's options
(:class:`LRARun`) and the schedule, configuration and model they resolve to are in
:mod:`nystrom_lab.lra.run`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from nystrom_lab.attention_spec import label
from nystrom_lab.data.lra.cifar import load_cifar10
from nystrom_lab.data.lra.collate import collate_pair, collate_single
from nystrom_lab.data.lra.listops import generate_listops
from nystrom_lab.data.lra.loaders import load_aan, load_imdb, load_listops
from nystrom_lab.data.lra.pathfinder_io import load_pathfinder
from nystrom_lab.lra.presets import (
    DATA_SOURCES,
    LISTOPS_DATA_SEED,
    LISTOPS_GENERATOR,
    LISTOPS_SIZES,
    TASK_SPECS,
)
from nystrom_lab.lra.run import LRARun, build_model, model_config, train_config  # noqa: F401 (re-exported)
from nystrom_lab.training import Task, evaluate, train
from nystrom_lab.training.preflight import check_splits


class MissingDataError(FileNotFoundError):
    """The task's data files are not where ``--data`` points (or no ``--data`` was given)."""


def _require(root: Path | None, task: str, present: bool) -> None:
    files, source = DATA_SOURCES[task]
    if not present:
        where = "no --data given" if root is None else f"data not found at {root}"
        raise MissingDataError(f"{task}: {where}. Expected {', '.join(files)} under --data, from {source}.")


def _listops_dir(run: LRARun, out: Path) -> Path:
    """``run.data``, or ListOps generated (once, deterministically) into ``out/data``."""
    if run.data is not None:
        return Path(run.data)
    sizes = run.listops_sizes or LISTOPS_SIZES[run.preset]
    gen = LISTOPS_GENERATOR[run.preset]
    root = out / "data"
    marker = root / "generated.json"
    want = {"sizes": list(sizes), "seed": LISTOPS_DATA_SEED, "config": dataclasses.asdict(gen)}
    if marker.exists():
        have = json.loads(marker.read_text())
        if have != want:
            raise ValueError(f"{root} holds ListOps generated with {have}, not {want}; use another --out")
        return root
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise MissingDataError(
            f"listops: {marker} does not exist; generate the data once in a single process (or with"
            " `nystrom data listops DIR` and pass --data DIR) before a multi-process run"
        )
    print(f"[nystrom] generating ListOps {sizes} (train, dev, test) into {root}")
    generate_listops(
        root,
        train=sizes[0],
        dev=sizes[1],
        test=sizes[2],
        seed=LISTOPS_DATA_SEED,
        workers=max(1, min(4, os.cpu_count() or 1)),
        config=gen,
    )
    marker.write_text(json.dumps(want, indent=2))  # written last: a half-generated folder is redone
    return root


def load_splits(run: LRARun, out: Path) -> dict[str, Dataset]:
    """train/dev/test datasets of ``run.task`` in the release formats (see ``DATA_SOURCES``)."""
    task, length = run.task, run.length()
    if task == "listops":
        root = _listops_dir(run, out)
        _require(root, task, all((root / f).is_file() for f in DATA_SOURCES[task][0]))
        return {s: load_listops(root, split=s, max_length=length) for s in ("train", "dev", "test")}
    if run.data is None:
        _require(None, task, False)
    root = Path(run.data)
    if task == "text":
        _require(root, task, all((root / s / c).is_dir() for s in ("train", "test") for c in ("neg", "pos")))
        test = load_imdb(root, split="test", max_length=length)
        return {"train": load_imdb(root, split="train", max_length=length), "dev": test, "test": test}
    if task == "retrieval":
        _require(root, task, all((root / f).is_file() for f in DATA_SOURCES[task][0]))
        return {s: load_aan(root, split=s, max_length=length) for s in ("train", "dev", "test")}
    if length != 1024:
        raise ValueError(
            f"{task}: images are 32x32 = 1024 pixel tokens; --max-length must be 1024, got {length}"
        )
    if task == "image":
        _require(root, task, all((root / f).is_file() for f in DATA_SOURCES[task][0]))
        return {s: load_cifar10(root, split=s) for s in ("train", "dev", "test")}
    # Pathfinder: --data is the folder holding curv_contour_length_14/, or that folder itself
    difficulty = None if (root / "metadata").is_dir() else 14
    _require(
        root, task, (root / "metadata").is_dir() or (root / "curv_contour_length_14" / "metadata").is_dir()
    )
    return {s: load_pathfinder(root, split=s, difficulty=difficulty) for s in ("train", "dev", "test")}


def classification_step(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, int]]]:
    """Mean cross-entropy and the accuracy (correct, count) of one batch (a device tensor: no sync)."""
    out = model(**batch)
    correct = (out.logits.argmax(-1) == batch["labels"]).sum()
    return out.loss, {"accuracy": (correct, int(batch["labels"].shape[0]))}


def make_task(run: LRARun, out: Path) -> Task:
    """Model, data, collate and step of ``run`` as a :class:`nystrom_lab.training.Task`."""
    model = build_model(run)  # first: a bad --attention fails before any data is generated or loaded
    splits = load_splits(run, out)
    spec = TASK_SPECS[run.task]
    if spec.dual:
        collate = collate_pair
    else:
        padded, trim = spec.padded, spec.padded and not run.pool_padding

        def collate(items: list) -> dict[str, torch.Tensor]:
            return collate_single(items, padded=padded, trim=trim)

    name = f"lra-{run.task}-{label(run.attention)}"
    return Task(
        model=model,
        train=splits["train"],
        dev=splits["dev"],
        test=splits["test"],
        collate=collate,
        step=classification_step,
        name=name,
    )


def _check_same_run(out: Path, record: dict) -> None:
    """A resumed folder must hold the same task/model/data; the loop only checks the TrainConfig."""
    path = out / "lra_run.json"
    if path.exists():
        have = json.loads(path.read_text())
        if have != record:
            diff = sorted(k for k in set(have) | set(record) if have.get(k) != record.get(k))
            raise ValueError(
                f"{out} holds a run with different {diff}; use another --out or the same options"
            )


def run_lra(run: LRARun, *, progress: bool = True) -> dict:
    """Train and test one LRA run; writes ``out/{lra_run.json, results.json, metrics.jsonl, curves.png}``.

    Returns the loop's results with ``test`` = metrics of the best-dev weights on the full test split.
    """
    out = run.out_dir()
    task = make_task(run, out)
    check_splits(task)  # the test split too: the loop is given none (it is evaluated below)
    cfg = train_config(run)
    record = {
        "task": run.task,
        "attention": label(run.attention),  # canonical: `nystrom` and `nystrom-64` resume each other
        "preset": run.preset,
        "data": str(Path(run.data).resolve()) if run.data is not None else None,
        "pool_padding": run.pool_padding,
        "listops_sizes": list(run.listops_sizes) if run.listops_sizes else None,
        "model_config": task.model.config.definition(),
    }
    _check_same_run(out, record)
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "lra_run.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    test = task.test
    # the loop would bound the test pass by eval_batches too; test here, once, on every example
    results = train(dataclasses.replace(task, test=None), cfg, out, progress=progress)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    full = dataclasses.replace(cfg, eval_batches=None)
    results["test"] = evaluate(task, task.model, test, full, rank=rank, world=world)
    results["test_examples"] = len(test)
    if rank == 0:
        (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    return results
