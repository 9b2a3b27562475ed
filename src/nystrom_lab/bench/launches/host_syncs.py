"""Host syncs for the launch counter: what makes a GPU's host wait for the device, and what the meta
device hands back in their place so that a count goes on past them (see :mod:`.launches`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

#: ops that read device data on the host, or whose output shape depends on it (a stream sync on CUDA)
SYNCS = {
    "_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "_unique", "_unique2",
    "unique_dim", "unique_consecutive", "equal", "allclose", "tolist",
}  # fmt: skip
#: copies that can move data between the host and a device
COPIES = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"}
#: the host-side synchronisation calls (not ATen ops): module or class, attribute
#: (torch.accelerator is newer than torch 2.4, the floor: it is left out where it does not exist)
EXPLICIT_SYNCS = tuple(
    (owner, "synchronize")
    for owner in (torch.cuda, getattr(torch, "accelerator", None), torch.cuda.Stream, torch.cuda.Event)
    if owner is not None and hasattr(owner, "synchronize")
)


def _fake_scalar(args: tuple) -> bool | int | float:
    """A stand-in for a host read of a meta tensor (which holds no value): True/1/1.0 by dtype."""
    t = args[0]
    if t.dtype == torch.bool:
        return True
    return 1.0 if t.is_floating_point() else 1


def _devices(args: tuple, kwargs: dict) -> set[str]:
    """The device types of the tensors among ``args`` and ``kwargs``, lists included (0-dim host tensors
    left out: a kernel takes those by value), and of a ``device=`` argument."""
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    found = {a.device.type for a in leaves if isinstance(a, torch.Tensor) and (a.dim() > 0 or not a.is_cpu)}
    if kwargs.get("device") is not None:
        found.add(torch.device(kwargs["device"]).type)
    return found


def crosses_host(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether an op moves data between the host and a device: a copy, or an op handed a host tensor
    beside device tensors (an index tensor, say, which it first copies to the device)."""
    devices = _devices(args, kwargs)
    return "cpu" in devices and len(devices) > 1


def _is_mask(index: torch.Tensor | None) -> bool:
    """Whether an ``index`` entry is a boolean mask (indexing with it runs ``nonzero``)."""
    return index is not None and index.dtype in (torch.bool, torch.uint8)


def _selected(mask: torch.Tensor) -> list[torch.Tensor]:
    """A stand-in for ``mask.nonzero()`` as indices (one long tensor per mask dim): every element."""
    count = mask.numel()
    return [torch.zeros(count, dtype=torch.long, device=mask.device) for _ in range(mask.dim())]


def stand_in(func, name: str, args: tuple, kwargs: dict):
    """What a data-dependent op or a host copy returns on meta, where it cannot run: every element
    selected (the largest shape), or an uninitialised host tensor; None where the op runs as it is."""
    t = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if t is None or not t.is_meta:
        return None
    if name == "_local_scalar_dense":
        return _fake_scalar(args)
    if name == "nonzero":
        return torch.zeros(t.numel(), t.dim(), dtype=torch.long, device=t.device)
    if name == "masked_select":
        return t.new_empty(torch.broadcast_shapes(t.shape, args[1].shape).numel())
    if name in ("_unique", "_unique2", "unique_dim", "unique_consecutive"):
        flat = t.reshape(-1) if name != "unique_dim" else t
        inverse = torch.zeros(t.shape, dtype=torch.long, device=t.device)
        return flat.clone(), inverse, torch.zeros(flat.shape[:1], dtype=torch.long, device=t.device)
    if name == "repeat_interleave":
        return torch.zeros(t.numel(), dtype=torch.long, device=t.device)
    if name == "index" and any(_is_mask(i) for i in args[1]):
        indices = []
        for i in args[1]:
            indices += _selected(i) if _is_mask(i) else [i]
        return func(t, indices)
    if (name in COPIES and "cpu" in _devices(args[1:], kwargs)) or kwargs.get("device") == torch.device(
        "cpu"
    ):
        return torch.empty(t.shape, dtype=kwargs.get("dtype") or t.dtype, device="cpu")
    return None


def data_dependent(name: str, args: tuple, kwargs: dict) -> bool:
    """Ops that need device data on the host to know their output: a sync on a GPU."""
    if name in SYNCS:
        return True
    if name == "index":  # a boolean mask index runs nonzero
        return any(_is_mask(i) for i in args[1])
    if name == "repeat_interleave":  # the Tensor overload sums the repeats on the host unless told
        return kwargs.get("output_size") is None and (len(args) < 2 or args[1] is None)
    return False


@contextlib.contextmanager
def explicit_syncs(record: Callable[[str], None]) -> Iterator[None]:
    """Within the block, the host synchronisation calls are recorded as syncs (and still run where a
    device is present; on a machine without one they return at once)."""
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr in EXPLICIT_SYNCS]

    def recorder(original, label):
        def synchronize(*args, **kwargs):
            record(label)
            if torch.cuda.is_available():
                return original(*args, **kwargs)
            return None

        return synchronize

    try:
        for owner, attr, original in saved:
            label = f"{getattr(owner, '__name__', owner)}.{attr}".removeprefix("torch.")
            setattr(owner, attr, recorder(original, label))
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)
