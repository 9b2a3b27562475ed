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
import functools
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


#: the integer parameters a typical launch passes as multiples of 16 (strides, m, n, d, dv, the split
#: length): Triton then marks them, and every pointer, ``tt.divisibility = 16`` and vectorises and
#: pipelines the loads (more shared memory); ``aligned="strides"`` leaves m and n unmarked (any m and
#: sequence length: the common launch), ``aligned=False`` marks nothing
_ALIGNED_INTS = re.compile(r"s[a-z]*[bhn]|m|n|d|dv|per_split")


def _kernels() -> dict[str, object]:
    from nystrom.ops.nystrom.fused import backward_kernels, forward_kernels

    return {name: getattr(module, name) for module in (forward_kernels, backward_kernels)
            for name in dir(module) if hasattr(getattr(module, name), "fn")}  # the @triton.jit kernels


@functools.cache
def fingerprints() -> dict[str, str]:
    """Per kernel, a hash of its source and of the ``@triton.jit`` helpers it calls (recursively), read
    once per process: a row compiled from other source is stale."""
    import hashlib

    def sources(fn, seen: set) -> list[str]:
        out = [inspect.getsource(fn)]
        for name, value in fn.__globals__.items():
            helper = getattr(value, "fn", None)
            if callable(helper) and name not in seen and re.search(rf"\b{name}\(", out[0]):
                seen.add(name)
                out += sources(helper, seen)
        return out

    return {name: hashlib.sha1("".join(sources(k.fn, {name})).encode()).hexdigest()[:12]
            for name, k in _kernels().items()}  # fmt: skip


class _CompileTimeoutError(Exception):
    pass


def compile_kernel(kernel: str, *, arch: int, dtype: str, constexprs: dict, num_warps: int,
                   num_stages: int | None = None, aligned: bool | str = True, timeout_s: int = 0) -> dict:  # fmt: skip
    """One fused kernel compiled for ``sm_<arch>`` with tiles ``constexprs`` (``DOT``/``PRECISION`` added
    from ``dtype`` where the kernel takes them): registers and stack bytes per thread (cuobjdump), shared
    memory per block (Triton's metadata) and the compile's seconds. A compile past ``timeout_s`` (0: none)
    raises ``TimeoutError`` (Triton's ptxas subprocess is killed with it)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 builds the kernels for the interpreter: unset it to compile them")
    import signal
    import time

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nystrom.ops.nystrom.fused.launch import PINV_DOT, dot_options

    fn = _kernels()[kernel]
    params = inspect.signature(fn.fn).parameters
    constexprs = dict(constexprs)
    if "DOT" in params:
        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        constexprs |= dot_options(torch_dtype)
    if "PINV_DOT" in params:  # the per-head kernels' m×m products: the launchers' default unless given
        constexprs.setdefault("PINV_DOT", PINV_DOT)
    signature = _signature(fn, dtype, constexprs)
    attrs = {}
    if aligned:
        for i, (name, kind) in enumerate(signature.items()):
            free = aligned == "strides" and name in ("m", "n")
            if kind != "constexpr" and not free and (kind.startswith("*") or _ALIGNED_INTS.fullmatch(name)):
                attrs[(i,)] = [["tt.divisibility", 16]]
    options = {"num_warps": num_warps} | ({} if num_stages is None else {"num_stages": num_stages})

    def expire(*_):
        raise _CompileTimeoutError

    before = signal.signal(signal.SIGALRM, expire) if timeout_s else None
    signal.alarm(timeout_s)
    start = time.perf_counter()
    try:
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", arch, 32), options=options)  # fmt: skip
    except _CompileTimeoutError:
        raise TimeoutError(f"{kernel} for sm_{arch} took over {timeout_s} s to compile") from None
    finally:
        signal.alarm(0)
        if before is not None:
            signal.signal(signal.SIGALRM, before)
    seconds = time.perf_counter() - start
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin)], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
    regs, stack = (int(re.search(rf"{key}:(\d+)", usage).group(1)) for key in ("REG", "STACK"))
    return {"registers": regs, "stack_bytes": stack, "shared_bytes": int(compiled.metadata.shared),
            "compile_s": round(seconds, 1), "source": fingerprints()[kernel]}  # fmt: skip


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
