"""The one training loop, shared by pretraining, fine-tuning and LRA.

Determinism: the example order is a pure function of (seed, global step) — epoch e is a fixed
permutation seeded by (seed, e) and step s takes examples [s·B, (s+1)·B) of the concatenated epochs —
so a resumed run needs no sampler state, and a DDP run with W processes sees exactly the global batches
of a 1-process run (rank r takes every W-th slice of each micro-batch). RNG states (dropout) are
checkpointed per rank. A run killed at any point and restarted with the same command continues from
its last checkpoint and reaches the same weights as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from nystrom_lab.training.checkpoint import (
    find_checkpoint,
    load_checkpoint,
    load_weights,
    rng_state,
    save_checkpoint,
    save_weights,
    set_rng_state,
)
from nystrom_lab.training.config import RUNTIME_FIELDS, TrainConfig
from nystrom_lab.training.device import autocast, check_precision, grad_scaler, init_distributed, to_device
from nystrom_lab.training.evaluate import _eval_order, evaluate  # noqa: F401 (_eval_order: re-exported)
from nystrom_lab.training.logging import MetricsLog, plot_curves
from nystrom_lab.training.runlock import guard_run_folder
from nystrom_lab.training.schedule import make_scheduler
from nystrom_lab.training.task import Task
from nystrom_lab.training.watch import LossWatch, count_tokens


def shutdown_distributed() -> None:
    """Leave the process group that :func:`train` joined under torchrun; no-op otherwise.

    Call it after the last collective of a successful run. Why: a gloo group left to interpreter exit
    can abort a rank ("terminate called without an active exception"; 1 in 2-4 two-process runs on a
    loaded machine, also when each rank destroys its group unsynchronised), failing a run whose work was
    done; with all ranks meeting first, 12 of 12 passed. The wait has no short timeout because rank 0
    may still be writing predictions (a long IMDB test set) when the others arrive. NCCL has no
    monitored barrier; its plain barrier waits the same way.
    """
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(hours=24))
        else:
            dist.barrier()
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


def _param_groups(
    model: nn.Module, weight_decay: float, *, lr: float, lr_scale: tuple[tuple[str, float], ...] = ()
) -> list[dict]:
    """AdamW groups: decay on matrices only (not on biases and norms), and each ``lr_scale`` glob's
    parameters at ``lr · factor`` (the first matching glob wins). A glob that matches no trainable
    parameter raises: a misspelt name must not train silently at the base rate."""
    groups: dict[tuple[bool, float], list[nn.Parameter]] = {}
    used = set()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        factor = 1.0
        for glob, f in lr_scale:
            if fnmatch.fnmatchcase(name, glob):
                factor = f
                used.add(glob)
                break
        groups.setdefault((p.dim() >= 2, factor), []).append(p)
    unused = [g for g, _ in lr_scale if g not in used]
    if unused:
        raise ValueError(
            f"lr_scale glob(s) {unused} match no trainable parameter name of {type(model).__name__}"
        )
    order = sorted(groups, key=lambda key: (not key[0], key[1]))  # decayed first: old checkpoints' order
    return [
        {"params": groups[key], "weight_decay": weight_decay if key[0] else 0.0, "lr": lr * key[1]}
        for key in order
    ]


def _wrap(model: nn.Module, device: torch.device, world: int, compile_: bool) -> tuple[nn.Module, nn.Module]:
    """(the DDP module or ``model``, the module the training forward runs: that one, compiled on request)."""
    ddp = model
    if world > 1:
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    return ddp, torch.compile(ddp) if compile_ else ddp


@guard_run_folder  # data splits checked, then OUT locked against a second run, and run.json written
def train(
    task: Task, cfg: TrainConfig, out_dir: Path, *, progress: bool = True, stop_after: int | None = None
) -> dict:
    """Train ``task`` with ``cfg``, writing checkpoints and logs to ``out_dir``; resume if a checkpoint is there.

    Runs on ``cfg.device`` (``auto``: CUDA when available) in ``cfg.precision``; under torchrun each
    process takes one GPU (NCCL) or the CPU (gloo). Returns the final results (best dev metrics and the
    one test evaluation). ``stop_after`` ends the run after that many steps *without* the final
    evaluation (for tests that simulate an interruption).
    """
    rank, world, device = init_distributed(cfg.device)
    check_precision(cfg.precision, device)
    out_dir = Path(out_dir)
    micro = cfg.batch_size // cfg.grad_accum
    if micro % world:
        raise ValueError(
            f"batch_size/grad_accum = {micro} must be divisible by the number of processes ({world})"
        )
    local = micro // world
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    model = task.model.to(device)  # before the optimiser: its state is created beside the parameters
    torch.manual_seed(cfg.seed + rank)
    groups = _param_groups(model, cfg.weight_decay, lr=cfg.lr, lr_scale=cfg.lr_scale)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    sched = make_scheduler(opt, warmup=cfg.warmup, total=cfg.steps)
    scaler = grad_scaler(device, cfg.precision)
    start, best, best_step = 0, None, -1
    ckpt = find_checkpoint(out_dir / "last")
    if ckpt is not None:
        state, meta, rng = load_checkpoint(ckpt, model=model, rank=rank)
        saved = {k: v for k, v in TrainConfig.upgrade(meta["config"]).items() if k not in RUNTIME_FIELDS}
        if saved != cfg.resumable_dict():  # device and compile may change: checkpoints load anywhere
            raise ValueError(
                f"{ckpt} was written with a different configuration; use a new output folder or the same options"
            )
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if "scaler" in state:
            scaler.load_state_dict(state["scaler"])
        start, best, best_step = meta["step"], meta["best"], meta["best_step"]
        if rng is not None:
            set_rng_state(rng, device)
    ddp, fwd = _wrap(model, device, world, cfg.compile)
    # a fresh run (no checkpoint) drops every earlier line, its step-0 evaluation included
    log = MetricsLog(out_dir, enabled=rank == 0, resume_step=start if ckpt is not None else -1)
    if rank == 0 and start == 0:
        cfg.save(out_dir / "train_config.json")
    better = (lambda a, b: a > b) if cfg.metric_mode == "max" else (lambda a, b: a < b)
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc=task.name, unit="step", dynamic_ncols=True)
    if task.dev is not None and cfg.eval_at_start and start == 0:
        log.write({"step": 0, "split": "dev", **evaluate(task, model, task.dev, cfg, rank=rank, world=world)})
    model.train()
    watch = LossWatch(device)
    t0 = t_log = time.time()
    last = start
    end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
    for step in range(start, end):
        idx = global_batch(len(task.train), step, cfg.batch_size, cfg.seed)
        opt.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=device)
        tokens = 0
        for a in range(cfg.grad_accum):
            mb = idx[a * micro : (a + 1) * micro][rank * local : (rank + 1) * local]
            cpu_batch = task.collate([task.train[i] for i in mb])
            tokens += count_tokens(cpu_batch)
            batch = to_device(cpu_batch, device)
            sync = a == cfg.grad_accum - 1 or world == 1
            with ddp.no_sync() if (world > 1 and not sync) else contextlib.nullcontext():
                try:
                    with autocast(device, cfg.precision):
                        loss, _ = task.step(fwd, batch)
                    scaler.scale(loss / cfg.grad_accum).backward()
                except Exception as err:  # a diverged run fails inside the model: report the divergence
                    try:
                        watch.check(cfg.precision)
                    except FloatingPointError as fpe:
                        raise fpe from err
                    raise
            step_loss += loss.detach().float() / cfg.grad_accum
        watch.add(step, step_loss, sched.get_last_lr()[0], tokens)
        gnorm = None
        if cfg.clip is not None:
            scaler.unscale_(opt)  # clip the true gradients, not the fp16-scaled ones
            gnorm = nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)  # a device tensor: no sync
        scaler.step(opt)
        scaler.update()
        sched.step()
        done = step + 1
        if bar is not None:
            bar.update(1)
        if done % cfg.log_every == 0 or done == end:
            watch.check(cfg.precision)
            now = time.time()
            rate = watch.tokens * world / max(now - t_log, 1e-9)
            rec = {"step": done, "split": "train", "loss": watch.mean_loss(), "lr": sched.get_last_lr()[0],
                   "grad_norm": None if gnorm is None else float(gnorm),  # JSON has no NaN: unclipped logs null
                   "time": now - t0}  # fmt: skip
            if watch.tokens:
                rec["tokens_per_s"] = rate
            log.write(rec)
            if bar is not None:
                bar.set_postfix(
                    loss=f"{rec['loss']:.4f}", **({"tok/s": f"{rate:,.0f}"} if watch.tokens else {})
                )
            watch.reset()
            t_log = now
        if task.dev is not None and (done % cfg.eval_every == 0 or done == cfg.steps):
            watch.check(cfg.precision)
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
            watch.check(cfg.precision)  # never checkpoint diverged weights
            _checkpoint(out_dir, model, opt, sched, scaler, cfg, done, best, best_step, rank, world, device)
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


def _checkpoint(out_dir, model, opt, sched, scaler, cfg, step, best, best_step, rank, world, device) -> None:
    rng = rng_state(device)
    states = [None] * world
    if world > 1:
        dist.all_gather_object(states, rng)
    else:
        states = [rng]
    if rank == 0:
        meta = {"step": step, "best": best, "best_step": best_step, "config": json.loads(cfg.to_json())}
        state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
        if scaler.is_enabled():
            state["scaler"] = scaler.state_dict()
        save_checkpoint(out_dir / "last", model=model, state=state, meta=meta, rank_states=states)
    if world > 1:
        dist.barrier()
