"""Independent ListOps evaluator: parses the Source *string*, never the generator's tree.

Legend: n symbols of one expression.

Used by the tests to check every generated label and usable on the LRA release files. It shares no code
with :mod:`nystrom_lab.data.lra.listops`: it tokenises the string itself, drops the pair-tree parentheses and
runs a stack machine over prefix expressions ``[OP a1 ... ak ]``. MED follows ``int(np.median(args))``.
"""

from __future__ import annotations

import numpy as np

_FUNCS = {
    "[MIN": lambda a: int(np.min(a)),
    "[MAX": lambda a: int(np.max(a)),
    "[MED": lambda a: int(np.median(a)),
    "[SM": lambda a: int(np.sum(a)) % 10,
}


def evaluate_listops(source: str) -> int:
    """Value 0..9 of a ListOps Source string (with or without the parentheses).

    Raises ``ValueError`` for an unknown symbol, an unbalanced ``]``, an operator without arguments or
    trailing symbols after the root expression.
    """
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for tok in source.split():
        if tok in ("(", ")"):
            continue
        if result is not None:
            raise ValueError(f"symbol {tok!r} after the end of the expression")
        if tok in _FUNCS:
            stack.append((tok, []))
        elif tok == "]":
            if not stack:
                raise ValueError("']' without an open operator")
            op, args = stack.pop()
            if not args:
                raise ValueError(f"operator {op} closed without arguments")
            value = _FUNCS[op](args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        elif len(tok) == 1 and tok.isdigit():
            if stack:
                stack[-1][1].append(int(tok))
            else:  # a bare digit is a whole expression (a tree of length 1)
                result = int(tok)
        else:
            raise ValueError(f"unknown ListOps symbol {tok!r}")
    if stack or result is None:
        raise ValueError("unterminated expression: missing ']'")
    return result
