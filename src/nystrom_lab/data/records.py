"""The records runs and benchmarks leave behind, read and written in one place for every layer: the training
log (``metrics.jsonl``) and its median step time, a run's options as JSON, an input file's portable
description, and the machine and software a record was made on.

Standard library only at import time (``nystrom docs render`` reads the logs without torch); torch is
imported by :func:`environment` alone, when it is called.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar

METRICS_LOG = "metrics.jsonl"

R = TypeVar("R")


# ---------------------------------------------------------------- the training log
def read_metrics(path: str | os.PathLike[str], *, missing_ok: bool = False) -> list[dict]:
    """The records of a ``metrics.jsonl`` training log (``{"step", "split", ...}`` per line), in file order;
    ``[]`` for a missing file when ``missing_ok``."""
    path = Path(path)
    if missing_ok and not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def median_step_s(train: list[dict], *, eval_steps: Collection[int] = ()) -> float | None:
    """Median seconds per optimiser step between consecutive train records of one segment (a resumed run
    restarts its clock, so an interval whose step or time goes back is left out): unlike the wall time,
    robust to pauses. An interval holding an evaluation (or checkpoint) at one of ``eval_steps`` is left out
    too: it runs after the step that triggers it and lands in the next interval. None: no interval."""
    rates = [
        (b["time"] - a["time"]) / (b["step"] - a["step"])
        for a, b in zip(train, train[1:])
        if b["step"] > a["step"]
        and b["time"] > a["time"]
        and not any(a["step"] <= e < b["step"] for e in eval_steps)
    ]
    return statistics.median(rates) if rates else None


# ---------------------------------------------------------------- a run's options
def options_record(run: Any) -> dict:
    """A run's options (a dataclass) as JSON holds them: every field, paths as text."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(run).items()}


def options_from_record(cls: type[R], data: dict) -> R:
    """The run of class ``cls`` that :func:`options_record` describes: JSON's lists back to tuples, the text
    of a field typed ``Path`` back to a path."""
    hints = typing.get_type_hints(cls)

    def value(name: str, v: Any) -> Any:
        if isinstance(v, list):
            return tuple(value("", x) for x in v)
        if isinstance(v, str) and hints.get(name) in (Path, Path | None):
            return Path(v)
        return v

    return cls(**{k: value(k, v) for k, v in data.items()})


def describe_file(path: str | os.PathLike[str]) -> dict[str, object]:
    """A portable record of an input file for run records: its ``name``, ``bytes`` and ``sha256``, plus
    ``package`` (``"name==version"``) and ``path`` inside it when the file ships with an installed
    distribution (the bundled MiniLM tokenizer), else ``path`` relative to the working folder when it lies
    under it. Never a machine's absolute path: records compare equal across machines and checkouts."""
    import hashlib
    import importlib.metadata as md

    p = Path(path).resolve()
    data = p.read_bytes()
    out: dict[str, object] = {"name": p.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    parts = p.parts
    if "site-packages" in parts:
        inside = parts[parts.index("site-packages") + 1 :]
        dists = md.packages_distributions().get(inside[0], [])
        if dists:
            out["package"] = f"{dists[0]}=={md.version(dists[0])}"
        out["path"] = "/".join(inside)
    elif p.is_relative_to(Path.cwd().resolve()):
        out["path"] = p.relative_to(Path.cwd().resolve()).as_posix()
    return out


# ---------------------------------------------------------------- the machine and the software
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what :func:`platform.processor` says, or
    ``"unknown"``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def installed_version(package: str) -> str | None:
    """The installed version of ``package`` (``_`` and ``-`` alike), None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package.replace("_", "-"))
    except PackageNotFoundError:
        return None


def environment(*packages: str) -> dict[str, Any]:
    """What a record says about where it was made: ``cpu`` (model name), ``threads`` (torch's, an int),
    ``cores``, ``platform``, ``torch``, ``python`` and each of ``packages`` (its installed version, None
    when it is not installed). Every record takes the keys it reports from this one dict."""
    import torch

    return {
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        **{p: installed_version(p) for p in packages},
    }
