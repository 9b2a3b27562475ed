"""Which code path a tensor takes: the CPU's (cache-blocked, threaded kernels) or the accelerator's.

Why one predicate: on CPU the library cuts work into cache-sized blocks and runs it on its own thread
pool; on a GPU (and on the meta device, which stands in for one when counting launches) every extra op is
a kernel launch, so the same maths runs as few large ops instead. Every branch between the two asks
:func:`accelerator_path`, so meta, CUDA and any other device take the same path, and each op or layer
piece asks it in one dispatch function only (``tests/test_architecture.py`` lists them): callers above
call the op and ask nothing themselves.

:func:`force_accelerator_path` runs the accelerator path on CPU tensors: tests compare the two paths'
numbers on one machine without a GPU.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_forced = threading.local()


def accelerator_path(t: torch.Tensor) -> bool:
    """True unless ``t`` is on the CPU (and the accelerator path is not forced there)."""
    return t.device.type != "cpu" or getattr(_forced, "on", False)


@contextlib.contextmanager
def force_accelerator_path() -> Iterator[None]:
    """Within the block (this thread), CPU tensors take the accelerator path too (for tests)."""
    before = getattr(_forced, "on", False)
    _forced.on = True
    try:
        yield
    finally:
        _forced.on = before
