"""Run the attention module and a whole model in every dtype, inference and training; print JSON.

Run by tests/layers/test_cpu_paths.py in a child process whose oneDNN and ATen are limited to AVX2
(``ONEDNN_MAX_CPU_ISA=AVX2``, ``ATEN_CPU_CAPABILITY=avx2``: both are read once per process), so an
AVX-512 machine runs what an AVX2-only CPU runs. Each case reports whether its outputs (and gradients) are finite, the largest absolute difference of real
tokens' outputs from the float32 result of the same weights and inputs (None for the model's training step,
where dropout is on), or the error it raised.
"""

import json
import sys

import torch

from nystrom.attention import NystromAttention
from nystrom.layers.onednn import linear_compute_dtype, linear_supports
from nystrom.model import NystromformerConfig, NystromformerForMaskedLM


def _module(dtype, autocast, train, n):
    torch.manual_seed(0)
    layer = NystromAttention(32, heads=2, dim_head=16, num_landmarks=8, conv_kernel_size=5)
    x = torch.randn(2, n, 32)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n - 7 :] = False
    ref = layer(x, mask).detach()
    if not autocast:
        layer, x = layer.to(dtype), x.to(dtype)
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        if train:
            x.requires_grad_(True)
            y = layer(x, mask)
            y.float().square().mean().backward()
            grads = [p.grad for p in layer.parameters()] + [x.grad]
            finite = all(bool(torch.isfinite(g).all()) for g in grads) and bool(torch.isfinite(y).all())
        else:
            with torch.inference_mode():
                y = layer(x, mask)
            finite = bool(torch.isfinite(y).all())
    return finite, (y.detach().float() - ref)[mask].abs().max().item()


def _model(dtype, autocast, train, n):
    cfg = NystromformerConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=128,
                              attention={"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 5})  # fmt: skip
    torch.manual_seed(0)
    model = NystromformerForMaskedLM(cfg)
    ids = torch.randint(0, 60, (2, n))
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, n - 9 :] = 0
    labels = torch.where(torch.rand(2, n) < 0.3, ids, -100)
    model.eval()
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits
    model.train(train)
    if not autocast:
        model = model.to(dtype)
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        if train:
            out = model(ids, attention_mask=mask, labels=labels)
            out.loss.backward()
            finite = bool(torch.isfinite(out.loss)) and all(
                bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None
            )
            return finite, None  # training: dropout is on, so no reference; a finite loss and gradients
        with torch.inference_mode():
            logits = model(ids, attention_mask=mask).logits
    real = mask.bool()
    return bool(torch.isfinite(logits).all()), (logits.float() - ref)[real].abs().max().item()


def main() -> None:
    results = {
        "bf16_fused": linear_supports(torch.bfloat16),
        "fp32_fused": linear_supports(torch.float32),
        "bf16_compute": str(linear_compute_dtype(torch.bfloat16)),
        "torch_bf16_flag": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cases": {},
    }
    for what, fn, n in (("module", _module, 40), ("module_long", _module, 16384), ("model", _model, 48)):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for autocast in (False, True) if dtype != torch.float32 else (False,):
                for train in (False, True):
                    if what == "module_long" and (train or autocast):
                        continue  # the fused CPU kernels take over at this length in inference only
                    key = f"{what}/{str(dtype)[6:]}/{'autocast' if autocast else 'cast'}/{'train' if train else 'infer'}"
                    try:
                        finite, diff = fn(dtype, autocast, train, n)
                        results["cases"][key] = {"finite": finite, "diff": diff}
                    except Exception as err:  # reported, asserted on by the test
                        results["cases"][key] = {"error": f"{type(err).__name__}: {err}"[:300]}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
