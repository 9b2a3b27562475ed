"""The fused kernels compiled for a GPU without one: registers and spill stack per thread, from the cubin.

``python -m nystrom_lab.bench.gpu.kernel_resources [--arch 90] [--dtype bf16] [--m 64] [--d 64]`` prints
one row per kernel of :mod:`nystrom.ops.nystrom.fused`, compiled by Triton for ``sm_<arch>`` exactly as a
launch would compile it (the tile sizes and warps of :mod:`~nystrom.ops.nystrom.fused.launch`), and read
back with the ``cuobjdump`` that ships with Triton. No GPU is needed: Triton's NVIDIA backend carries
``ptxas``. A stack above 0 means registers spilled to local memory (slow); this is the first thing to
tune on a GPU.

``--sweep --out docs/gpu/kernel_resources.json`` compiles every kernel over the grid ``covers()`` takes for
every target arch (:mod:`.kernel_grid`, :mod:`.kernel_sweep`: resumable, one compile at a time, about 90
minutes on one core) and then, like ``--write`` alone, writes the launch choices
(``nystrom/ops/nystrom/fused/configs.py``) and docs/gpu/kernel_resources.md from the table
(:mod:`.kernel_table`). Triton's interpreter (the CPU tests) cannot show whether a kernel compiles for the
GPU at all; ``tests/lab/bench/test_kernel_resources.py`` compiles a sample of the table on each CI run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nystrom_lab.bench.gpu.kernel_compile import _TRITON_TYPES, compile_kernel


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
        (landmark_pinv, dict(BM=bm, BD=bd, PINV_DOT=PINV_DOT), warps("landmark_pinv", bm, bd=bd)),
        (key_pass, dict(BM=bm, BN=bn, BD=bd, BDV=bd, **dots), warps("key_pass", bm, torch_dtype, bd=bd)),
        (key_combine, dict(BM=bm, BDV=bd, PINV_DOT=PINV_DOT), warps("key_combine", bm, torch_dtype, bdv=bd)),
        (query_pass, dict(BN=bn, BM=bm, BD=bd, BDV=bd, CONV=True, **dots), warps("query_pass", bm, torch_dtype, bd=bd)),
        (query_backward, dict(BN=bn, BM=bm, BD=bd, BDV=bd, **dots), warps("query_backward", bm, torch_dtype, bd=bd)),
        (landmark_backward, dict(BM=bm, BD=bd, BDV=bd, PINV_DOT=PINV_DOT), warps("landmark_backward", bm, bd=bd)),
        (key_backward, dict(BN=bn, BM=bm, BD=bd, BDV=bd, BK=block(65), CONV=True, **dots),
         warps("key_backward", bm, torch_dtype, bd=bd)),
        (query_landmarks, dict(BN=bn, BM=bm, BD=bd), 4),
    ]


def launched(kernel: str, dtype: str, m: int, d: int, dv: int, conv: bool, arch: int) -> dict:
    """``kernel`` compiled for ``sm_<arch>`` as the library launches it for inputs of ``dtype`` with m
    landmarks, head dims d and dv and the conv on or off: tiles from ``launch.block``, warps from
    ``launch.warps`` (the sweep's choice, :mod:`nystrom.ops.nystrom.fused.configs`). The row's key fields
    (kernel, arch, dtype, constexprs, warps, aligned) and what :func:`compile_kernel` reads."""
    import torch

    from nystrom.ops.nystrom.fused.launch import block, warps
    from nystrom_lab.bench.gpu import kernel_grid as grid

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    config = grid.Config(kernel, None if kernel in grid.DTYPE_FREE else dtype, block(m), block(d), block(dv))
    uses = grid._uses(kernel)
    config = config._replace(**{f: 16 for f, t in (("bm", "BM"), ("bd", "BD"), ("bdv", "BDV")) if t not in uses})
    variants = grid.constexprs(config)
    constexprs = next((c for c in variants if c.get("CONV", conv) == conv), variants[0])
    num_warps = warps(kernel, config.bm, torch_dtype, bd=block(d), bdv=block(dv))
    dt = dtype if kernel not in grid.DTYPE_FREE else "bf16"  # the table's dtype of a dtype-free kernel
    measured = compile_kernel(kernel, arch=arch, dtype=dt, constexprs=constexprs, num_warps=num_warps)
    return {"kernel": kernel, "arch": arch, "dtype": dt, "constexprs": constexprs, "warps": num_warps,
            "aligned": True, **measured}  # fmt: skip


def resources(*, arch: int = 90, dtype: str = "bf16", m: int = 64, d: int = 64) -> list[dict]:
    """Every fused kernel compiled for ``sm_<arch>`` as the launchers configure it at m landmarks and head
    dim d: name, warps, registers, stack bytes per thread, shared bytes per block."""
    rows = []
    for kernel, constexprs, num_warps in _cases(dtype, m, d):
        constexprs = {k: v for k, v in constexprs.items() if k not in ("DOT", "PRECISION")}
        name = kernel.fn.__name__
        got = compile_kernel(name, arch=arch, dtype=dtype, constexprs=constexprs, num_warps=num_warps)
        rows.append({"kernel": name, "warps": num_warps, **got})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nystrom_lab.bench.gpu.kernel_resources", description=__doc__)
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200), 80 (A100)")
    p.add_argument("--dtype", choices=sorted(_TRITON_TYPES), default="bf16")
    p.add_argument("--m", type=int, default=64, help="landmarks")
    p.add_argument("--d", type=int, default=64, help="head dim")
    p.add_argument("--sweep", action="store_true", help="compile the whole grid into --out (resumable), then"
                   " write the launch configs and the doc from it")  # fmt: skip
    p.add_argument("--write", action="store_true", help="only write the configs and the doc from --out")
    p.add_argument("--out", type=Path, default=Path("docs/gpu/kernel_resources.json"), help="the sweep's table")
    p.add_argument("--limit", type=int, default=None, help="compile at most this many cells (--sweep)")
    a = p.parse_args(argv)
    if a.sweep or a.write:
        from nystrom_lab.bench.gpu import kernel_sweep, kernel_table

        if a.sweep:
            kernel_sweep.sweep(a.out, limit=a.limit, log=lambda line: print(line, flush=True))
        kernel_table.write(a.out)
        return 0
    print(f"sm_{a.arch}, {a.dtype}, m = {a.m}, d = {a.d}\n")
    print("| kernel | warps | registers | stack (B/thread) | shared (B/block) |\n|---|---:|---:|---:|---:|")
    for r in resources(arch=a.arch, dtype=a.dtype, m=a.m, d=a.d):
        print(f"| `{r['kernel']}` | {r['warps']} | {r['registers']} | {r['stack_bytes']} | {r['shared_bytes']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
