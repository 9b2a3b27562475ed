"""Compiling one fused kernel for a GPU without one: the signature Triton needs, the source fingerprints
the sweep keys its rows by, and :func:`compile_kernel` (registers, spill stack and shared memory from the
cubin and Triton's metadata). Used by :mod:`.kernel_resources` (its command) and :mod:`.kernel_sweep`."""

from __future__ import annotations

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
_INT_POINTERS = {"seg_ptr", "bounds_ptr", "count_ptr", "span_ptr"}
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
