"""Metamorphic tests: padding and batch-mates change no real token's output."""

import torch

from nystrom import NystromAttention
from nystrom.functional import nystrom_attention

from oracle import rel_err, right_pad_mask


def test_right_padding_equals_unpadded_functional():
    b, h, n, d, L = 1, 2, 48, 8, 29
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3))
    mask = right_pad_mask([L], n)
    padded = nystrom_attention(q, k, v, num_landmarks=8, mask=mask)
    alone = nystrom_attention(q[:, :, :L], k[:, :, :L], v[:, :, :L], num_landmarks=8)
    assert rel_err(padded[:, :, :L], alone) <= 1e-12
    garbage = [t.clone() for t in (q, k, v)]
    for t in garbage:
        t[:, :, L:] = torch.randn_like(t[:, :, L:]) * 1e3
    again = nystrom_attention(*garbage, num_landmarks=8, mask=mask)
    assert rel_err(again[:, :, :L], padded[:, :, :L]) <= 1e-12


def test_module_padding_invariance_including_conv():
    torch.manual_seed(3)
    mod = NystromAttention(32, heads=4, dim_head=8, num_landmarks=8, conv_kernel_size=5).double().eval()
    L, n = 21, 40
    x = torch.randn(2, n, 32, dtype=torch.float64)
    mask = right_pad_mask([L, n], n)
    full = mod(x, mask=mask)
    alone = mod(x[:1, :L])
    assert rel_err(full[0, :L], alone[0]) <= 1e-12
    x2 = x.clone()
    x2[0, L:] = torch.randn(n - L, 32, dtype=torch.float64) * 100
    again = mod(x2, mask=mask)
    assert rel_err(again[0, :L], full[0, :L]) <= 1e-12
    assert torch.equal(again[1], full[1])


def test_left_and_holey_padding_is_invariant():
    q, k, v = (torch.randn(1, 2, 30, 4, dtype=torch.float64) for _ in range(3))
    keep = torch.tensor([i % 3 != 1 for i in range(30)])  # a mask with holes
    out = nystrom_attention(q, k, v, num_landmarks=5, mask=keep[None])
    alone = nystrom_attention(q[:, :, keep], k[:, :, keep], v[:, :, keep], num_landmarks=5)
    assert rel_err(out[:, :, keep], alone) <= 1e-12


def test_sample_output_independent_of_batch_mates():
    q, k, v = (torch.randn(4, 2, 32, 8, dtype=torch.float64) for _ in range(3))
    q[1:] *= 6  # batch-mates with much sharper attention -> very different ‖A‖₁
    k[1:] *= 6
    batched = nystrom_attention(q, k, v, num_landmarks=8)
    alone = nystrom_attention(q[:1], k[:1], v[:1], num_landmarks=8)
    assert rel_err(batched[:1], alone) <= 1e-12


def test_original_pinv_init_breaks_batch_independence():
    # Documents the public implementations' fault that pinv_init="original" reproduces.
    q, k, v = (torch.randn(4, 2, 32, 8, dtype=torch.float64) for _ in range(3))
    q[1:] *= 6
    k[1:] *= 6
    batched = nystrom_attention(q, k, v, num_landmarks=8, pinv_init="original")
    alone = nystrom_attention(q[:1], k[:1], v[:1], num_landmarks=8, pinv_init="original")
    assert rel_err(batched[:1], alone) > 1e-4
