"""Checks of a task's data before training starts (called once by :func:`nystrom_lab.training.train`).

An empty split or an empty example used to pass the loaders and fail late: a ZeroDivisionError when the
first batch is drawn, a "metric not among the dev metrics []" error at the first evaluation, or a KeyError
at the final test pass, after all the training. The file readers name the file and line of a bad
example; this is the loop-level guard for data sets built any other way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def check_split(name: str, data: Sequence) -> None:
    """Raise ValueError naming split ``name`` if ``data`` is empty, or if it reports its examples'
    ``lengths`` (as the LRA token data sets do) and one has length 0."""
    source = getattr(data, "source", None)
    where = f" ({source})" if source else ""
    if len(data) == 0:
        action = "train on" if name == "train" else "evaluate"
        raise ValueError(
            f"the {name} split{where} is empty: there is nothing to {action}; check the data folder "
            "or the size options"
        )
    lengths = getattr(data, "lengths", None)
    empty = np.flatnonzero(np.asarray(lengths) < 1) if lengths is not None else ()
    if len(empty):
        raise ValueError(
            f"the {name} split{where} holds {len(empty)} empty example(s) (no tokens; the first at "
            f"index {int(empty[0])}); remove them from the data"
        )


def check_splits(task: Any) -> None:
    """:func:`check_split` on ``task.train`` and on ``task.dev`` and ``task.test`` where given."""
    for name in ("train", "dev", "test"):
        data = getattr(task, name)
        if data is not None:
            check_split(name, data)
