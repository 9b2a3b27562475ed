"""Batch size 0 works everywhere: every attention variant returns an empty (0, n, dim) output (#15).

Reformer crashed with batch 0 (an ambiguous ``reshape(0, -1)``); the Nyström kernels did from n = 16384,
where they split the work between threads. Legend: b batch, n tokens, e model dim.
"""

from __future__ import annotations

import pytest
import torch

from nystrom.attention import REGISTRY

DIM = 32
#: small options so that the short length takes each method's non-trivial path (several chunks/blocks)
SMALL = {
    "nystrom": {"num_landmarks": 8},
    "longformer": {"window_size": 9},
    "performer": {"num_features": 32},
    "reformer": {"bucket_size": 8},
}
LONG = 16384  # the Nyström kernels' threaded path


def _case(name: str, n: int, *, backward: bool = False):
    return pytest.param(name, n, id=f"{name}-n{n}")


def _build(name: str, n: int):
    extra = {"max_seq_len": n, "proj_len": 16} if name == "linformer" else SMALL.get(name, {})
    torch.manual_seed(0)
    return REGISTRY[name](DIM, heads=2, dim_head=16, **extra)


@pytest.mark.parametrize("name, n", [_case(name, n) for name in sorted(REGISTRY) for n in (37, LONG)])
def test_batch_zero_gives_an_empty_output_of_the_right_shape(name, n):
    mod = _build(name, n)
    x = torch.randn(0, n, DIM)  # (b=0, n, e)
    with torch.no_grad():
        y = mod(x)
        assert y.shape == (0, n, DIM) and y.dtype == x.dtype
        assert mod(x, torch.ones(0, n, dtype=torch.bool)).shape == (0, n, DIM)
    with torch.inference_mode():
        assert mod(x).shape == (0, n, DIM)


@pytest.mark.parametrize("name, n", [_case(name, 37, backward=True) for name in sorted(REGISTRY)])
def test_batch_zero_backward_gives_empty_and_zero_gradients(name, n):
    mod = _build(name, n)
    x = torch.randn(0, n, DIM, requires_grad=True)
    mod(x).sum().backward()
    assert x.grad is not None and x.grad.shape == (0, n, DIM)
    grads = [p.grad for p in mod.parameters() if p.grad is not None]
    assert grads and all(float(g.abs().sum()) == 0.0 for g in grads)
