"""What the training loop trains and evaluates: :class:`Task` and the shapes of its functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

#: forward(model, batch) -> (mean loss, {metric: (sum, count) or per-example rows}); see training.evaluate
StepFn = Callable[[nn.Module, dict], tuple[torch.Tensor, dict[str, tuple[float, int]]]]
#: {metric: mean over the evaluated examples} -> further metrics that are no such mean (e.g. F1)
DerivedFn = Callable[[dict[str, float]], dict[str, float]]
#: {name: per-example rows the step collected, concatenated over the evaluation} -> metrics
FinalizeFn = Callable[[dict[str, torch.Tensor]], dict[str, float]]


@dataclass
class Task:
    """What the loop trains: a model, map-style data sets, a collate function and a step function.

    ``derived`` turns an evaluation's means into metrics that are not means over examples (F1 from the
    rates of true/false positives and false negatives); they are logged and can select the best step.
    ``finalize`` computes metrics from the per-example tensors a step returns (see
    :mod:`nystrom_lab.training.evaluate`): Spearman's rank correlation, macro-F1, Matthews.
    ``layout`` says how examples sit in rows (``documents``: packed, ``stream``, ``off``: padded; see
    :mod:`nystrom_lab.text.layout`), recorded in ``run.json``; None where a task does not say.
    """

    model: nn.Module
    train: Sequence
    collate: Callable[[list], dict]
    step: StepFn
    dev: Sequence | None = None
    test: Sequence | None = None
    name: str = "task"
    derived: DerivedFn | None = None
    finalize: FinalizeFn | None = None
    layout: str | None = None
