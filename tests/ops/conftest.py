"""Fixtures of the op tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def launch_grids(monkeypatch) -> dict[str, tuple]:
    """The grid of every fused kernel launched in the test (the last launch of each name), kernels still
    run: ``{kernel name: grid}``."""
    from nystrom.ops.nystrom.fused import backward as fused_backward
    from nystrom.ops.nystrom.fused import forward as fused_forward

    grids: dict[str, tuple] = {}
    for module in (fused_forward, fused_backward):
        real_launch = module.launch

        def recording(kernel, grid, *a, _real=real_launch, **k):
            grids[kernel.__name__] = grid
            return _real(kernel, grid, *a, **k)

        monkeypatch.setattr(module, "launch", recording)
    return grids
