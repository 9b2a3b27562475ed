"""The fused kernels compiled for a GPU without one: registers and spill stack per thread, from the cubin.

``python -m nystrom_lab.bench.gpu.kernel_resources [--arch 90] [--dtype bf16] [--m 64] [--d 64]`` prints
one row per kernel of :mod:`nystrom.ops.nystrom.fused`, compiled by Triton for ``sm_<arch>`` exactly as a
launch would compile it (the tile sizes and warps of :mod:`~nystrom.ops.nystrom.fused.launch`), and read
back with the ``cuobjdump`` that ships with Triton. No GPU is needed: Triton's NVIDIA backend carries
``ptxas``. A stack above 0 means registers spilled to local memory (slow); this is the first thing to
tune on a GPU.

Triton's interpreter (the CPU tests) cannot show whether a kernel compiles for the GPU at all;
``tests/lab/bench/test_kernel_resources.py`` compiles every kernel here on each CI run.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import tempfile
from pathlib import Path

#: the kernels' parameters that point at the inputs' dtype (per kernel, those that point at float32 instead)
_INPUT_POINTERS = {"q_ptr", "k_ptr", "v_ptr", "u_ptr", "o_ptr", "do_ptr", "dk_ptr", "dv_ptr", "dq_ptr"}
_FLOAT32_INSTEAD = {("query_backward", "dq_ptr")}  # the float32 dq scratch
_INT_POINTERS = {"seg_ptr", "bounds_ptr", "count_ptr"}
_TRITON_TYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


def _signature(kernel, dtype: str, constexprs: dict) -> dict[str, str]:
    out = {}
    for name in inspect.signature(kernel.fn).parameters:
        if name in constexprs:
            out[name] = "constexpr"
        elif name.endswith("_ptr"):
            if name in _INT_POINTERS:
                out[name] = "*i32"
            elif name in _INPUT_POINTERS and (kernel.fn.__name__, name) not in _FLOAT32_INSTEAD:
                out[name] = "*" + _TRITON_TYPES[dtype]
            else:
                out[name] = "*fp32"
        else:
            out[name] = "fp32" if name == "scale" else "i32"
    return out


def _cases(dtype: str, m: int, d: int) -> list[tuple[object, dict, int]]:
    """(kernel, constexprs, warps) as the launchers use them, for inputs of ``dtype``, m landmarks, head dim d."""
    import torch

    from nystrom.ops.nystrom.fused import backward_kernels as bk
    from nystrom.ops.nystrom.fused import forward_kernels as fk
    from nystrom.ops.nystrom.fused.launch import PINV_DOT, block, dot_options, warps

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    dots = dot_options(torch_dtype)
    bm, bd, bn = block(m), block(d), 64
    landmarks, landmark_pinv, key_pass, key_combine, query_pass = (
        fk.landmarks, fk.landmark_pinv, fk.key_pass, fk.key_combine, fk.query_pass)
    query_backward, landmark_backward, key_backward, query_landmarks = (
        bk.query_backward, bk.landmark_backward, bk.key_backward, bk.query_landmarks)
    return [
        (landmarks, dict(BN=bn, BD=bd), 4),
        (landmark_pinv, dict(BM=bm, BD=bd, PINV_DOT=PINV_DOT), warps("landmark_pinv", bm)),
        (key_pass, dict(BM=bm, BN=bn, BD=bd, BDV=bd, **dots), warps("key_pass", bm, torch_dtype)),
        (key_combine, dict(BM=bm, BDV=bd, PINV_DOT=PINV_DOT), warps("key_combine", bm)),
        (query_pass, dict(BN=bn, BM=bm, BD=bd, BDV=bd, CONV=True, **dots), warps("query_pass", bm, torch_dtype)),
        (query_backward, dict(BN=bn, BM=bm, BD=bd, BDV=bd, **dots), warps("query_backward", bm, torch_dtype)),
        (landmark_backward, dict(BM=bm, BD=bd, BDV=bd, PINV_DOT=PINV_DOT), warps("landmark_backward", bm)),
        (key_backward, dict(BN=bn, BM=bm, BD=bd, BDV=bd, BK=block(65), CONV=True, **dots),
         warps("key_backward", bm, torch_dtype)),
        (query_landmarks, dict(BN=bn, BM=bm, BD=bd), 4),
    ]


def resources(*, arch: int = 90, dtype: str = "bf16", m: int = 64, d: int = 64) -> list[dict]:
    """Every fused kernel compiled for ``sm_<arch>``: name, warps, registers and stack bytes per thread."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 builds the kernels for the interpreter: unset it to compile them")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    rows = []
    for kernel, constexprs, num_warps in _cases(dtype, m, d):
        source = ASTSource(fn=kernel, signature=_signature(kernel, dtype, constexprs), constexprs=constexprs)
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "kernel.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin)], capture_output=True,
                                   text=True, check=True).stdout  # fmt: skip
        regs, stack = (int(re.search(rf"{key}:(\d+)", usage).group(1)) for key in ("REG", "STACK"))
        rows.append({"kernel": kernel.fn.__name__, "warps": num_warps, "registers": regs, "stack_bytes": stack})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nystrom_lab.bench.gpu.kernel_resources", description=__doc__)
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200), 80 (A100)")
    p.add_argument("--dtype", choices=sorted(_TRITON_TYPES), default="bf16")
    p.add_argument("--m", type=int, default=64, help="landmarks")
    p.add_argument("--d", type=int, default=64, help="head dim")
    a = p.parse_args(argv)
    print(f"sm_{a.arch}, {a.dtype}, m = {a.m}, d = {a.d}\n\n| kernel | warps | registers | stack (B/thread) |")
    print("|---|---:|---:|---:|")
    for r in resources(arch=a.arch, dtype=a.dtype, m=a.m, d=a.d):
        print(f"| `{r['kernel']}` | {r['warps']} | {r['registers']} | {r['stack_bytes']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
