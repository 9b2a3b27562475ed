"""The Moore–Penrose pseudo-inverse of the landmark kernel A: ``naive`` (the plain reference iterations; a
leaf only the tests import), ``iterations`` (the same iterations as the library runs them: the CPU path),
``op`` (the ``nystrom::iterative_pinv`` custom op with its backward and autocast rule), ``triton`` (its
CUDA forward) and ``dispatch`` (the entry points, and the one choice between them)."""

from nystrom.ops.pinv.dispatch import PINV_INITS, exact_pinv, iterative_pinv

__all__ = ["PINV_INITS", "exact_pinv", "iterative_pinv"]
