"""Lazy attributes for package ``__init__`` modules (PEP 562), as transformers and torch load their
submodules: ``import nystrom`` costs almost nothing, and ``nystrom.NystromformerModel`` imports the model
stack (torch, transformers) on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_attributes(package: str, names: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose public ``names`` live in the given submodules
    (``{"NystromformerModel": "nystrom.model.modeling_nystromformer", ...}``; a name mapped to its own
    module path is that submodule). Each name is imported once, then cached in the package."""

    def getattr_(name: str) -> object:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(where)
        value = module if where == f"{package}.{name}" else getattr(module, name)
        globals_ = importlib.import_module(package).__dict__
        globals_[name] = value  # the next access is a plain attribute
        return value

    def dir_() -> list[str]:
        return sorted({*importlib.import_module(package).__dict__, *names})

    return getattr_, dir_
