"""Evaluation for the loop: metric sums kept on the device, one host transfer per evaluation.

A task's step function returns ``(loss, metrics)``. A metric given as ``(sum, count)`` (floats or
0-dim tensors on the device) is averaged over the evaluated examples; a metric given as a tensor with
one row per example (e.g. logits and labels) is *collected*: concatenated over batches and processes
and handed to ``Task.finalize``, which computes metrics that are no mean (macro-F1, Matthews,
Spearman). Under several processes every rank receives the same results.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from nystrom_lab.training.device import autocast, to_device

if TYPE_CHECKING:
    from nystrom_lab.training.config import TrainConfig
    from nystrom_lab.training.task import Task


def _eval_order(data: Sequence, *, partial: bool) -> list[int]:
    """Example order of an evaluation: by length when the set exposes ``lengths`` and is evaluated whole.

    Metrics are sums over examples, so the order changes nothing but speed: batches of similar lengths
    carry little padding once a collate trims it (LRA ListOps dev: ≈ 2× faster). A partial evaluation
    keeps the natural order so that it always sees the same first examples.
    """
    lengths = getattr(data, "lengths", None)
    if partial or lengths is None:
        return list(range(len(data)))
    return sorted(range(len(data)), key=lambda i: (int(lengths[i]), i))


def _sum_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


def evaluate(
    task: Task,
    model: nn.Module,
    data: Sequence,
    cfg: TrainConfig,
    *,
    rank: int = 0,
    world: int = 1,
    full: bool = False,
) -> dict:
    """Mean loss and metrics over ``data`` (its first ``cfg.eval_batches`` batches unless ``full``), across
    ranks, on the device of ``model``'s parameters under ``cfg.precision``."""
    device = next(model.parameters()).device
    bs = cfg.eval_batch_size or cfg.batch_size
    n_batches = math.ceil(len(data) / bs)
    if cfg.eval_batches is not None and not full:
        n_batches = min(n_batches, cfg.eval_batches)
    order = _eval_order(data, partial=n_batches * bs < len(data))
    sums: dict[str, list] = {}
    rows: dict[str, list[torch.Tensor]] = {}
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast(device, cfg.precision):
        for bi in range(rank, n_batches, world):
            batch = to_device(task.collate([data[i] for i in order[bi * bs : (bi + 1) * bs]]), device)
            loss, metrics = task.step(model, batch)
            count = len(next(iter(batch.values())))
            for k, val in {"loss": (loss.detach().float() * count, count), **metrics}.items():
                if isinstance(val, torch.Tensor):
                    rows.setdefault(k, []).append(val.detach())
                    continue
                acc = sums.setdefault(k, [0.0, 0])
                acc[0] = acc[0] + val[0]  # stays a device tensor when the step gives one: no sync
                acc[1] += val[1]
    model.train(was_training)
    keys = sorted(sums)
    if world > 1:  # a rank with no batch knows no metric names: agree on the union before reducing
        names: list = [None] * world
        dist.all_gather_object(names, keys)
        keys = sorted({k for ks in names for k in ks})
    dtype = _sum_dtype(device)
    zero = [torch.zeros((), dtype=dtype, device=device), 0]
    vec = torch.stack(
        [torch.as_tensor(v, dtype=dtype, device=device) for k in keys for v in sums.get(k, zero)]
    ) if keys else torch.zeros(0, dtype=dtype, device=device)  # fmt: skip
    if world > 1:
        dist.all_reduce(vec)  # on the device: NCCL reduces CUDA tensors only
    flat = vec.tolist()  # the one host transfer of the evaluation
    res = {k: flat[2 * i] / max(flat[2 * i + 1], 1) for i, k in enumerate(keys)}
    if task.derived is not None:
        res |= task.derived(res)
    if task.finalize is not None:
        res |= task.finalize(_gather_rows(rows, world))
    return res


def _gather_rows(rows: dict[str, list[torch.Tensor]], world: int) -> dict[str, torch.Tensor]:
    """Collected per-example tensors, concatenated over batches and then over ranks (on the CPU)."""
    local = {k: torch.cat(v).cpu() for k, v in rows.items()}
    if world == 1:
        return local
    parts: list = [None] * world
    dist.all_gather_object(parts, local)
    keys = sorted({k for p in parts for k in p})
    return {k: torch.cat([p[k] for p in parts if k in p]) for k in keys}
