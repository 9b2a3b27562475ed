import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))  # tests import the float64 oracles from oracle.py

if not torch.cuda.is_available():
    # Without a GPU, Triton's CPU interpreter runs the fused kernels (tests/ops/test_fused_kernels.py). Set
    # before anything imports triton: triton.language's own @jit helpers (tl.max, tl.sum, ...) are built for
    # the interpreter only when it is on at their import, and torch.compile's tests import triton early.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist (scripts/test.sh runs the suite on every core): a worker runs torch on its share of the cores,
# so that the workers do not oversubscribe them (an OpenMP op whose threads wait for a descheduled sibling
# stalls). Tests of the CPU kernels' thread pool ask for two threads themselves (fixture two_threads).
if "PYTEST_XDIST_WORKER" in os.environ:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, torch.get_num_threads() // workers))
THREADS = torch.get_num_threads()

# Property-based tests: HYPOTHESIS_PROFILE=ci (default: short, derandomized, so CI is stable) or long
# (local fuzzing: many random examples, failures kept in .hypothesis/ and replayed first).
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, database=None)
settings.register_profile("long", max_examples=2000, deadline=timedelta(seconds=10))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skipped (with the reason shown) on machines without it."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
    if torch.get_num_threads() != THREADS:  # the next test starts with the worker's count again
        torch.set_num_threads(THREADS)


@pytest.fixture
def two_threads():
    """At least two intra-op threads for the test (restored after), so that the CPU kernels' work items run
    on the thread pool of ``utils/parallel.py``, as on a 2-core machine: an xdist worker has one core's
    share."""
    prev = torch.get_num_threads()
    torch.set_num_threads(max(2, prev))
    yield
    torch.set_num_threads(prev)


@pytest.fixture
def free_port() -> int:
    """A TCP port that was free a moment ago, for torchrun's rendezvous (a fixed one can be taken)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
