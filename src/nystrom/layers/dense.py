"""Linear layers for inference, with the activation fused into the GEMM on CPU.

Legend: r rows (any leading dims flattened), i input width, o output width.

In inference on CPU, ``F.linear`` runs the bias broadcast and the GEMM, and an activation after it is one
more pass over the (r, o) result. oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``, the kernel
inductor's CPU backend emits for fused linear + pointwise) applies bias and activation inside the GEMM.
Measured on a 2-core AMD EPYC, fp32, MiniLM's shapes: FFN in + GELU + FFN out on 1365 rows 16.2 ms
against 19.4 ms, the (4096, 384) → 1152 q/k/v projection 16.9 against 18.8 ms. Same function; the
results differ by GEMM rounding only (≈ 4e-6 absolute at these widths in fp32).

Only eagerly, without autograd, on CPU, in float32 or bfloat16 (the operands' dtype, or CPU autocast's, to
which both are cast as autocast would), while ``torch.backends.mkldnn.enabled`` is on. ``onednn.py`` probes
once which dtypes this CPU's oneDNN runs: bf16 needs AVX-512 or AVX2-VNNI-2, so on an AVX2-only CPU a bf16
linear computes in fp32 (bf16 operands are exact in fp32) and rounds its result to bf16, several times
faster there than any bf16 GEMM. Everywhere else (training, torch.compile, GPUs, float16/float64, a
PyTorch built without oneDNN) ``F.linear`` and the activation run, which compute the same function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nystrom.layers.onednn import CANDIDATE_DTYPES, POST_OPS, linear_compute_dtype
from nystrom.utils.amp import autocast_enabled


def activation(name: str | None, x: torch.Tensor) -> torch.Tensor:
    """``name`` in ``gelu`` (erf), ``gelu_new`` (tanh approximation, HF's name), ``relu``, or None (identity)."""
    if name is None:
        return x
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_new":
        return F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu(x)
    raise ValueError(f"unknown activation {name!r}; expected one of 'gelu', 'gelu_new', 'relu'")


def _plan(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.dtype, torch.dtype] | None:
    """(result dtype, GEMM dtype) of oneDNN's fused kernel for these operands, or None where :func:`dense`
    runs ``F.linear`` (see the module docstring). The result dtype under CPU autocast is autocast's:
    ``F.linear`` would cast all three operands to it too; otherwise all three must share one dtype (a
    mismatch is left to ``F.linear``'s error). The GEMM dtype is the result's, or float32 for bfloat16 on
    CPUs without bf16 kernels (:func:`~nystrom.layers.onednn.linear_compute_dtype`)."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or x.device.type != "cpu":
        return None
    operands = (x, weight) if bias is None else (x, weight, bias)
    if autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        if not all(t.dtype in CANDIDATE_DTYPES for t in operands):
            return None
    else:
        dtype = x.dtype
        if not all(t.dtype == dtype for t in operands):
            return None
    compute = linear_compute_dtype(dtype)
    return None if compute is None else (dtype, compute)


def fused_dtype(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.dtype | None:
    """The dtype of :func:`dense`'s result where it runs oneDNN's fused kernel for these operands, or None
    where it runs ``F.linear``. bfloat16 is fused on every CPU whose oneDNN runs float32: where it has no
    bf16 kernel (AVX2-only CPUs) the GEMM runs in float32 and its result is rounded to bfloat16."""
    plan = _plan(x, weight, bias)
    return None if plan is None else plan[0]


def fuses(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether :func:`dense` runs oneDNN's fused kernel for these operands."""
    return fused_dtype(x, weight, bias) is not None


def dense(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, activation_name: str | None = None
) -> torch.Tensor:
    """``act(x · weightᵀ + bias)``: x (..., i), weight (o, i), bias (o,) or None -> (..., o).

    The activation (see :func:`activation`) is fused into oneDNN's GEMM where :func:`fused_dtype` gives a
    dtype (the result's, as ``F.linear``'s would be); elsewhere this is ``activation(F.linear(x, weight, bias))``.
    """
    if activation_name not in POST_OPS:
        raise ValueError(
            f"unknown activation {activation_name!r}; expected one of 'gelu', 'gelu_new', 'relu', None"
        )
    plan = _plan(x, weight, bias)
    if plan is None and torch.compiler.is_exporting() and x.dim() != 2:
        # ONNX: a (b, n, i) input exports as MatMul then Add, which ONNX Runtime runs apart; the rows as one
        # 2-D product export as a Gemm with the bias inside (4-10 % faster at MiniLM's sizes on a CPU)
        rows = F.linear(x.reshape(-1, x.shape[-1]), weight, bias)  # (r, o)
        return activation(activation_name, rows).view(*x.shape[:-1], weight.shape[0])
    if plan is None:
        return activation(activation_name, F.linear(x, weight, bias))
    dtype, compute = plan  # compute: dtype, or float32 for bf16 on CPUs without bf16 kernels
    attr, algorithm = POST_OPS[activation_name]
    rows = x.reshape(-1, x.shape[-1]).to(dtype).to(compute)  # (r, i): autocast's cast first, then compute's
    b = None if bias is None else bias.to(dtype).to(compute)
    w = weight.to(dtype).to(compute)  # (o, i)
    y = torch.ops.mkldnn._linear_pointwise(rows, w, b, attr, [], algorithm).to(dtype)  # (r, o)
    return y.view(*x.shape[:-1], weight.shape[0])


def dense_module(module: nn.Module, x: torch.Tensor, *, activation_name: str | None = None) -> torch.Tensor:
    """``act(module(x))``, through :func:`dense` when ``module`` is a plain ``nn.Linear`` without hooks. A
    subclass or wrapper (an adapter such as LoRA, a quantised layer) or a hooked layer is called as it is,
    so nothing it adds is bypassed."""
    plain = type(module) is nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)
    if plain:
        return dense(x, module.weight, module.bias, activation_name=activation_name)
    return activation(activation_name, module(x))
