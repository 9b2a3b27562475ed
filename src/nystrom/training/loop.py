"""The one training loop, shared by pretraining, fine-tuning and LRA.

Determinism: the example order is a pure function of (seed, global step) — epoch e is a fixed
permutation seeded by (seed, e) and step s takes examples [s·B, (s+1)·B) of the concatenated epochs —
so a resumed run needs no sampler state, and a DDP run with W processes sees exactly the global batches
of a 1-process run (rank r takes every W-th slice of each micro-batch). RNG states (dropout) are
checkpointed per rank. A run killed at any point and restarted with the same command continues from
its last checkpoint and reaches the same weights as an uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from nystrom.training.checkpoint import (
    find_checkpoint,
    load_checkpoint,
    load_weights,
    rng_state,
    save_checkpoint,
    save_weights,
    set_rng_state,
)
from nystrom.training.config import TrainConfig
from nystrom.training.logging import MetricsLog, plot_curves
from nystrom.training.runlock import guard_run_folder
from nystrom.training.schedule import make_scheduler

#: forward(model, batch) -> (mean loss, {metric: (sum, count)})
StepFn = Callable[[nn.Module, dict], tuple[torch.Tensor, dict[str, tuple[float, int]]]]
#: {metric: mean over the evaluated examples} -> further metrics that are no such mean (e.g. F1)
DerivedFn = Callable[[dict[str, float]], dict[str, float]]


@dataclass
class Task:
    """What the loop trains: a model, map-style data sets, a collate function and a step function.

    ``derived`` turns an evaluation's means into metrics that are not means over examples (F1 from the
    rates of true/false positives and false negatives); they are logged and can select the best step.
    """

    model: nn.Module
    train: Sequence
    collate: Callable[[list], dict]
    step: StepFn
    dev: Sequence | None = None
    test: Sequence | None = None
    name: str = "task"
    derived: DerivedFn | None = None


def _dist() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    return (dist.get_rank(), dist.get_world_size()) if world > 1 else (0, 1)


def shutdown_distributed() -> None:
    """Leave the process group that :func:`train` joined under torchrun; no-op otherwise.

    Call it after the last collective of a successful run. Why: a gloo group left to interpreter exit
    can abort a rank ("terminate called without an active exception"; 1 in 2-4 two-process runs on a
    loaded machine, also when each rank destroys its group unsynchronised), failing a run whose work was
    done; with all ranks meeting first, 12 of 12 passed. The wait has no short timeout because rank 0
    may still be writing predictions (a long IMDB test set) when the others arrive.
    """
    if dist.is_available() and dist.is_initialized():
        dist.monitored_barrier(timeout=timedelta(hours=24))
        dist.destroy_process_group()


def epoch_order(n: int, epoch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def global_batch(n: int, step: int, batch: int, seed: int) -> list[int]:
    """The example indices of optimiser step ``step`` (a pure function: resumption needs no state)."""
    out: list[int] = []
    pos = step * batch
    while len(out) < batch:
        epoch, off = divmod(pos, n)
        order = epoch_order(n, epoch, seed)
        take = order[off : off + batch - len(out)].tolist()
        out += take
        pos += len(take)
    return out


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.dim() < 2 else decay).append(p)  # no decay on biases and norms
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


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
    """Mean loss and metrics over ``data`` (its first ``cfg.eval_batches`` batches unless ``full``), across ranks."""
    bs = cfg.eval_batch_size or cfg.batch_size
    n_batches = math.ceil(len(data) / bs)
    if cfg.eval_batches is not None and not full:
        n_batches = min(n_batches, cfg.eval_batches)
    order = _eval_order(data, partial=n_batches * bs < len(data))
    sums: dict[str, list[float]] = {}
    was_training = model.training
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
        for bi in range(rank, n_batches, world):
            batch = task.collate([data[i] for i in order[bi * bs : (bi + 1) * bs]])
            loss, metrics = task.step(model, batch)
            count = len(next(iter(batch.values())))
            for k, (s, c) in {"loss": (float(loss) * count, count), **metrics}.items():
                acc = sums.setdefault(k, [0.0, 0.0])
                acc[0] += float(s)
                acc[1] += c
    model.train(was_training)
    keys = sorted(sums)
    if world > 1:  # a rank with no batch knows no metric names: agree on the union before reducing
        names: list = [None] * world
        dist.all_gather_object(names, keys)
        keys = sorted({k for ks in names for k in ks})
    vec = torch.tensor([v for k in keys for v in sums.get(k, [0.0, 0.0])], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(vec)
    res = {k: float(vec[2 * i] / max(vec[2 * i + 1], 1)) for i, k in enumerate(keys)}
    return res | task.derived(res) if task.derived is not None else res


@guard_run_folder  # data splits checked, then OUT locked against a second run, and run.json written
def train(
    task: Task, cfg: TrainConfig, out_dir: Path, *, progress: bool = True, stop_after: int | None = None
) -> dict:
    """Train ``task`` with ``cfg``, writing checkpoints and logs to ``out_dir``; resume if a checkpoint is there.

    Returns the final results (best dev metrics and the one test evaluation). ``stop_after`` ends the run
    after that many steps *without* the final evaluation (for tests that simulate an interruption).
    """
    rank, world = _dist()
    out_dir = Path(out_dir)
    micro = cfg.batch_size // cfg.grad_accum
    if micro % world:
        raise ValueError(
            f"batch_size/grad_accum = {micro} must be divisible by the number of processes ({world})"
        )
    local = micro // world
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    model = task.model
    torch.manual_seed(cfg.seed + rank)
    opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    sched = make_scheduler(opt, warmup=cfg.warmup, total=cfg.steps)
    start, best, best_step = 0, None, -1
    ckpt = find_checkpoint(out_dir / "last")
    if ckpt is not None:
        state, meta, rng = load_checkpoint(ckpt, model=model, rank=rank)
        if meta["config"] != json.loads(cfg.to_json()):
            raise ValueError(
                f"{ckpt} was written with a different configuration; use a new output folder or the same options"
            )
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start, best, best_step = meta["step"], meta["best"], meta["best_step"]
        if rng is not None:
            set_rng_state(rng)
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    log = MetricsLog(out_dir, enabled=rank == 0, resume_step=start)
    if rank == 0 and start == 0:
        cfg.save(out_dir / "train_config.json")
    better = (lambda a, b: a > b) if cfg.metric_mode == "max" else (lambda a, b: a < b)
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc=task.name, unit="step", dynamic_ncols=True)
    model.train()
    t0, last = time.time(), start
    end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
    for step in range(start, end):
        idx = global_batch(len(task.train), step, cfg.batch_size, cfg.seed)
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for a in range(cfg.grad_accum):
            mb = idx[a * micro : (a + 1) * micro][rank * local : (rank + 1) * local]
            batch = task.collate([task.train[i] for i in mb])
            sync = a == cfg.grad_accum - 1 or world == 1
            ctx = ddp.no_sync() if (world > 1 and not sync) else _Null()
            with ctx, torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                loss, _ = task.step(ddp, batch)
                (loss / cfg.grad_accum).backward()
            loss_sum += float(loss.detach()) / cfg.grad_accum
        if not math.isfinite(loss_sum):
            raise FloatingPointError(
                f"non-finite training loss {loss_sum} at step {step}; lower the lr or disable bf16"
            )
        gnorm = (
            float(nn.utils.clip_grad_norm_(model.parameters(), cfg.clip))
            if cfg.clip is not None
            else None  # JSON has no NaN: an unclipped run logs null
        )
        opt.step()
        sched.step()
        done = step + 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_sum:.4f}")
        if done % cfg.log_every == 0 or done == end:
            log.write(
                {
                    "step": done,
                    "split": "train",
                    "loss": loss_sum,
                    "lr": sched.get_last_lr()[0],
                    "grad_norm": gnorm,
                    "time": time.time() - t0,
                }
            )
        if task.dev is not None and (done % cfg.eval_every == 0 or done == cfg.steps):
            res = evaluate(task, model, task.dev, cfg, rank=rank, world=world)
            log.write({"step": done, "split": "dev", **res})
            if cfg.metric not in res:
                raise ValueError(
                    f"the selection metric {cfg.metric!r} is not among the dev metrics {sorted(res)}; "
                    "set TrainConfig.metric to one of them"
                )
            if best is None or better(res[cfg.metric], best):
                best, best_step = res[cfg.metric], done
                if rank == 0:
                    save_weights(out_dir / "best.safetensors", model)
        if done % cfg.ckpt_every == 0 or done == end:
            _checkpoint(out_dir, model, opt, sched, cfg, done, best, best_step, rank, world)
        last = done
    if bar is not None:
        bar.close()
    if stop_after is not None and last < cfg.steps:
        log.close()
        return {"step": last, "interrupted": True}
    results = {"step": last, "best_dev": best, "best_step": best_step, "metric": cfg.metric}
    if task.dev is not None and (out_dir / "best.safetensors").exists():
        if world > 1:
            dist.barrier()
        load_weights(out_dir / "best.safetensors", model)  # test once, with the best-dev weights
    if task.test is not None:
        results["test"] = evaluate(task, model, task.test, cfg, rank=rank, world=world, full=True)
    if rank == 0:
        (out_dir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
        log.close()
        try:
            plot_curves(out_dir / "metrics.jsonl", out_dir / "curves.png", title=task.name)
        except Exception as err:
            print(f"[nystrom] could not draw curves: {err}")
    return results


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _checkpoint(out_dir, model, opt, sched, cfg, step, best, best_step, rank, world) -> None:
    rng = rng_state()
    states = [None] * world
    if world > 1:
        dist.all_gather_object(states, rng)
    else:
        states = [rng]
    if rank == 0:
        meta = {"step": step, "best": best, "best_step": best_step, "config": json.loads(cfg.to_json())}
        state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
        save_checkpoint(out_dir / "last", model=model, state=state, meta=meta, rank_states=states)
    if world > 1:
        dist.barrier()
