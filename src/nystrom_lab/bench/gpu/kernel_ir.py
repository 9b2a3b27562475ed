"""The fused kernels' index arithmetic, read from Triton's IR: which products of strides or ``n`` are 32-bit.

A kernel computes ``ptr + pos * stride``; when ``pos`` and the stride are 32-bit the product wraps past
2³¹ (q, k, v as views of one (b, n, 3·h·d) projection pass it from n ≈ 175K at hidden 4096), and the load
reads the wrong row or faults. Triton's interpreter cannot show it (numpy, small inputs), and an input of
2³¹ elements does not fit a CI machine. So each kernel is lowered to its first IR (the AST's, no GPU
needed) and every ``arith.muli`` is traced back to the kernel's parameters: a 32-bit product that reaches
a stride (``s…b/h/n``) or ``n`` is a finding.

``python -m nystrom_lab.bench.gpu.kernel_ir`` prints the findings per kernel (none expected);
``tests/lab/bench/test_kernel_ir.py`` asserts there are none.
"""

from __future__ import annotations

import os
import re

#: parameters whose products must be 64-bit: the strides (sqb, sqh, sqn, ...) and the token count
_WIDE = re.compile(r"^(s[a-z]+[bhn]|n)$")
_DEF = re.compile(r"^\s*(%[\w.#]+)(?::\d+)? = ([\w.]+)(.*)$")
_VALUE = re.compile(r"%[\w.#]+")


def first_ir(kernel, signature: dict[str, str], constexprs: dict, *, arch: int = 90) -> str:
    """``kernel``'s IR as Triton's frontend writes it from the AST (before any pass), for ``sm_<arch>``."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 builds the kernels for the interpreter: unset it to lower them")
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": 4})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options),
                            backend.get_module_map(), context)  # fmt: skip
    return str(module)


def narrow_products(text: str) -> list[str]:
    """The 32-bit ``arith.muli`` lines of ``text`` whose operands derive from a stride or ``n``."""
    defs: dict[str, list[str]] = {}
    for line in text.splitlines():
        found = _DEF.match(line)
        if found:
            rhs = found.group(3).split(" : ")[0].split(" loc(")[0]
            defs[found.group(1)] = _VALUE.findall(rhs)

    def params(value: str, seen: set[str]) -> set[str]:
        if value in seen:
            return set()
        seen.add(value)
        if value not in defs:  # a kernel parameter (or a loop variable)
            return {value[1:]}
        return set().union(*(params(v, seen) for v in defs[value])) if defs[value] else set()

    bad = []
    for line in text.splitlines():
        if "arith.muli" not in line or not re.search(r": (tensor<[\dx]*xi32>|i32)(\s|$)", line):
            continue
        found = _DEF.match(line)
        operands = defs[found.group(1)] if found else []
        reached = set().union(*(params(v, set()) for v in operands)) if operands else set()
        if any(_WIDE.match(p) for p in reached):
            bad.append(f"{line.strip().split(' loc(')[0]}  <- {sorted(p for p in reached if _WIDE.match(p))}")
    return bad


def findings(*, dtype: str = "bf16", m: int = 64, d: int = 64) -> dict[str, list[str]]:
    """Every fused kernel's 32-bit products of strides or ``n`` (as the launchers configure them)."""
    from nystrom_lab.bench.gpu.kernel_compile import _signature
    from nystrom_lab.bench.gpu.kernel_resources import _cases

    return {
        kernel.fn.__name__: narrow_products(first_ir(kernel, _signature(kernel, dtype, constexprs), constexprs))
        for kernel, constexprs, _warps in _cases(dtype, m, d)
    }


def main() -> int:
    bad = 0
    for kernel, lines in findings().items():
        print(f"{kernel}: {len(lines)} 32-bit products of a stride or n")
        for line in lines:
            print("   ", line)
        bad += len(lines)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
