"""What the mask and the document boundaries determine, computed once per forward for all layers.

A model opens :func:`shared_plan` for its ``mask`` (and ``cu_seqlens``) once per forward; inside it every
call that passes those very objects computes a derived quantity (the landmark assignment, additive masks,
the documents' gather indices) once and shares it: on a GPU that is a dozen launches per layer saved,
and it never changes a result. Tensors derived inside the block and used as masks of their own (a packed
row's per-document mask) are admitted with :func:`adopt`, so what they determine is shared too.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

import torch

T = TypeVar("T")


def _version(t: torch.Tensor | None) -> int | None:
    """The tensor's version counter (bumped by every in-place edit); None for None and for inference
    tensors, which keep none (and cannot be edited in place outside inference mode)."""
    return None if t is None or t.is_inference() else t._version


class _Block:
    """One :func:`shared_plan` block: the tensors it admits (by identity, at their version) and its memo."""

    def __init__(self, mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None) -> None:
        self.mask, self.cu_seqlens = mask, cu_seqlens
        # id -> (tensor, version); holding the tensor keeps its id from being reused while the block lives
        self.admitted: dict[int, tuple[torch.Tensor, int | None]] = {}
        for t in (mask, cu_seqlens):
            if t is not None:
                self.admitted[id(t)] = (t, _version(t))
        self.memo: dict[Hashable, object] = {}

    def admits(self, t: torch.Tensor | None) -> bool:
        if t is None:
            return self.mask is None
        entry = self.admitted.get(id(t))
        return entry is not None and entry[0] is t and entry[1] == _version(t)


_BLOCK: contextvars.ContextVar[_Block | None] = contextvars.ContextVar("nystrom_shared_plan", default=None)


@contextlib.contextmanager
def shared_plan(mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None = None) -> Iterator[None]:
    """Within the block, calls whose ``mask`` (``None``: no padding) and ``cu_seqlens`` are these very
    objects compute what those determine once, and share it.

    A call with other tensors, or after one was modified in place, computes its own: sharing never changes
    a result, it only skips recomputing it. Not under ``torch.compile`` (the compiler dedupes). Nested in
    a block for the same tensors (a module inside a model), the outer block's memo is used."""
    outer = _BLOCK.get()
    if outer is not None and outer.admits(mask) and (cu_seqlens is None or outer.admits(cu_seqlens)):
        yield
        return
    token = _BLOCK.set(_Block(mask, cu_seqlens))
    try:
        yield
    finally:
        _BLOCK.reset(token)


def shared(
    owner: torch.Tensor | tuple[torch.Tensor | None, ...] | None, key: Hashable, compute: Callable[[], T]
) -> T:
    """``compute()``, once per :func:`shared_plan` block for ``owner`` (a mask, ``cu_seqlens`` or an adopted
    tensor, ``None`` = no mask; or a tuple of them, all admitted) and ``key``; outside a block that admits
    ``owner``, every time."""
    if torch.compiler.is_compiling():  # checked first: dynamo cannot trace a ContextVar
        return compute()
    block = _BLOCK.get()
    owners = owner if isinstance(owner, tuple) else (owner,)
    if block is None or not all(block.admits(t) for t in owners):
        return compute()
    slot = (tuple(id(t) for t in owners), key)
    if slot not in block.memo:
        block.memo[slot] = compute()
    return block.memo[slot]  # type: ignore[return-value]


def adopt(t: torch.Tensor) -> torch.Tensor:
    """Admit ``t`` (a tensor derived inside the current block, e.g. the documents' mask) to the block, so
    that what it determines is shared as the block's own mask's is. Returns ``t``; outside a block, a no-op."""
    if torch.compiler.is_compiling():  # checked first: dynamo cannot trace a ContextVar
        return t
    block = _BLOCK.get()
    if block is not None:
        block.admitted[id(t)] = (t, _version(t))
    return t


def padding(mask: torch.Tensor) -> torch.Tensor:
    """``~mask`` (b, n), True = padding; computed once per forward where the model shares its mask
    (:func:`shared_plan`): every layer zeroes its input and its V with it."""
    return shared(mask, "padding", lambda: ~mask)
