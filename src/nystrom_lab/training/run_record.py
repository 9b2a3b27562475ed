"""The record of a run folder's starts: ``OUT/run.json``.

Each start of a run (a fresh one or a resume) writes the command line, the resolved training and model
configuration, the seed, the data sizes, the data layout (packed documents or not) and the versions of
nystrom, torch, transformers and Python; the earlier starts of the same folder are kept under
``"previous"``. The one-run-per-folder lock that guards the folder while this is written is
:mod:`nystrom_lab.training.runlock`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nystrom_lab.data.records import environment

RECORD_NAME = "run.json"


def utc_now() -> str:
    """The time stamp of run records and lock files: ``2024-01-31 12:00:00 UTC``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _versions() -> dict[str, str | None]:
    import nystrom

    env = environment("transformers")
    return {"nystrom": nystrom.__version__, **{k: env[k] for k in ("torch", "transformers", "python")}}


def run_record(task: Any, cfg: Any) -> dict:
    """What this start of a run is: command, configuration (loop and model), seed, data sizes, versions."""
    model_cfg = getattr(getattr(task.model, "config", None), "to_dict", None)

    def size(data: Any) -> int | None:
        return None if data is None else len(data)

    return {
        "command": list(sys.argv),
        "cwd": os.getcwd(),
        "started": utc_now(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "seed": cfg.seed,
        "train_config": dataclasses.asdict(cfg),
        "task": task.name,
        "layout": getattr(task, "layout", None),  # how examples sit in rows (packed documents, padded, ...)
        "model_class": f"{type(task.model).__module__}.{type(task.model).__qualname__}",
        "model_config": model_cfg() if callable(model_cfg) else None,
        "examples": {"train": size(task.train), "dev": size(task.dev), "test": size(task.test)},
        "versions": _versions(),
    }


def write_run_record(folder: Path, record: dict) -> Path:
    """Write ``folder/run.json``: ``record``, with the earlier starts of this run under ``"previous"``."""
    path = Path(folder) / RECORD_NAME
    previous: list = []
    if path.exists():
        try:
            old = json.loads(path.read_text())
            previous = [*old.pop("previous", []), old]
        except ValueError:  # a half-written record of a killed run: start the history afresh
            previous = []
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**record, "previous": previous}, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)
    return path
