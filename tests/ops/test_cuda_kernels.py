"""CUDA paths of the ops: the fused attention kernels on a GPU against the float64 oracles.

Marker ``gpu``: skipped on machines without CUDA (conftest.py). Run them with ``pytest -m gpu`` (or
``scripts/gpu_check.sh``): all passed on an H100 on 2026-11-26.
"""

import inspect

import pytest
import torch

from nystrom.functional import nystrom_attention, softmax_attention

from oracle import nystrom_oracle, rel_err, right_pad_mask, softmax_oracle

pytestmark = pytest.mark.gpu

#: relative error bounds against float64, about 4x the same tests' CPU errors (fp32 / bf16 / fp16):
#: iterative Nyström 5.5e-7 / 5.0e-3 / 6.6e-4, SDPA 2.0e-7 / 2.1e-3 / 2.6e-4, m = n exact pinv 6.0e-5 / 4.3e-3 / 4.7e-4
TOL_NYSTROM = {torch.float32: 5e-6, torch.bfloat16: 2e-2, torch.float16: 3e-3}
TOL_SDPA = {torch.float32: 5e-6, torch.bfloat16: 1e-2, torch.float16: 1.5e-3}
TOL_EXACT = {torch.float32: 3e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _mask_kw(fn) -> str:
    params = inspect.signature(fn).parameters
    return "mask" if "mask" in params else "key_padding_mask"


def _qkv(dtype, b=2, h=4, n=96, d=32):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(dtype) for _ in range(3))  # rounded once
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_nystrom_on_cuda_with_padding_matches_the_float64_oracle(dtype):
    q, k, v = _qkv(dtype)
    mask = right_pad_mask([96, 61], 96)
    cuda = [t.cuda() for t in (q, k, v)]
    out = nystrom_attention(*cuda, num_landmarks=16, **{_mask_kw(nystrom_attention): mask.cuda()}).cpu()
    ref = nystrom_oracle(q, k, v, 16, mask=mask, pinv="iterative")
    assert out.dtype == dtype and torch.isfinite(out).all()
    real = mask[:, None, :, None].expand_as(ref)
    assert rel_err(out[real], ref[real]) < TOL_NYSTROM[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_m_equals_n_on_cuda_is_softmax_and_equals_sdpa(dtype):
    q, k, v = _qkv(dtype, n=48)
    mask = right_pad_mask([48, 30], 48)
    cuda = [t.cuda() for t in (q, k, v)]
    out = nystrom_attention(
        *cuda, num_landmarks=48, pinv="exact", **{_mask_kw(nystrom_attention): mask.cuda()}
    )
    exact = softmax_attention(*cuda, **{_mask_kw(softmax_attention): mask.cuda()})
    ref = softmax_oracle(q, k, v, mask)
    real = mask[:, None, :, None].expand_as(ref)
    assert rel_err(exact.cpu()[real], ref[real]) < TOL_SDPA[dtype]
    assert rel_err(out.cpu()[real], ref[real]) < TOL_EXACT[dtype]
