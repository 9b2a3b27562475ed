"""The forked cases of ``nystrom bench models`` (``run(..., fork=True)``, used by the time-boxed GPU benchmark).

The :class:`~nystrom_lab.bench.forkserver.CaseServer` worker imports this module once: torch, transformers'
model classes and our model, so a case process forked from it skips the seconds of imports a fresh
interpreter spends (on the H100 machine ≈ 14 s a case, docs/gpu/bench_models_gpu.json: 24 cases in 334 s).
Nothing here touches CUDA: each forked case starts its own CUDA context, as Table 1's forked GPU cases do.
"""

from __future__ import annotations

import torch  # noqa: F401 (imported once, in the worker)
import transformers

import nystrom.model  # noqa: F401
from nystrom_lab.bench.models.cases import measure  # noqa: F401 (the worker's target: imported with the models)

for _name in ("NystromformerModel", "NystromformerForMaskedLM", "BertModel", "BertForMaskedLM", "LongformerModel",
              "LongformerForMaskedLM", "BigBirdModel", "BigBirdForMaskedLM"):  # fmt: skip
    getattr(transformers, _name)  # transformers imports a model's module on first access
