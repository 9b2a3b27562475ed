"""A tiny deterministic classification task for the training-loop tests; also runnable as a script.

``python tests/lab/training/toy_task.py OUT_DIR [--kill-at STEP] [--world W]`` trains it; ``--kill-at`` SIGKILLs the
process right after that many optimiser steps of this invocation (simulating an interruption).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
from torch import nn

from nystrom_lab.training import Task, TrainConfig, shutdown_distributed, train


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_data(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def collate(items: list[dict]) -> dict:
    return {"x": torch.stack([i["x"] for i in items]), "y": torch.stack([i["y"] for i in items])}


def step(model: nn.Module, batch: dict):
    logits = model(batch["x"])
    loss = nn.functional.cross_entropy(logits, batch["y"])
    correct = (logits.argmax(-1) == batch["y"]).sum()  # a tensor: the loop reads it only when evaluating
    return loss, {"accuracy": (correct, len(batch["y"]))}


def make_task(kill_at: int | None = None, *, dropout: bool = True) -> Task:
    torch.manual_seed(123)
    model = ToyModel()
    if not dropout:
        model.net[2].p = 0.0
    calls = {"n": 0}

    def killing_step(m, b):
        if kill_at is not None and m.training:
            calls["n"] += 1
            if calls["n"] > kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return step(m, b)

    return Task(
        model=model,
        train=make_data(96, 0),
        dev=make_data(32, 1),
        test=make_data(32, 2),
        collate=collate,
        step=killing_step,
        name="toy",
    )


def config(**over) -> TrainConfig:
    base = dict(
        steps=12, batch_size=8, lr=3e-2, warmup=2, eval_every=4, checkpoint_every=3, log_every=1, seed=5
    )
    return TrainConfig(**{**base, **over})


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--kill-at", type=int)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--no-dropout", action="store_true")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    task = make_task(a.kill_at, dropout=not a.no_dropout)
    res = train(task, config(grad_accum=a.grad_accum, device=a.device), a.out, progress=False)
    if int(os.environ.get("RANK", "0")) == 0:
        print(res)
    shutdown_distributed()
    sys.exit(0)
