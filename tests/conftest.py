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


@pytest.fixture
def free_port() -> int:
    """A TCP port that was free a moment ago, for torchrun's rendezvous (a fixed one can be taken)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
