"""Where and how the loop computes: device resolution, mixed precision, process groups and device RNG.

Device strings: ``auto`` (CUDA when available, else the CPU; never MPS unasked), ``cpu``, ``cuda``,
``cuda:N`` and ``mps``. A device that is not there is an error, never a silent fall-back to the CPU.
Under ``torchrun`` each process takes ``cuda:LOCAL_RANK`` and joins an NCCL group (gloo on the CPU).

Precisions: ``fp32``; ``bf16`` and ``fp16`` run the forward under :func:`torch.autocast` for the
device's type (weights and optimiser state stay float32); ``fp16`` also scales the loss with
:class:`torch.amp.GradScaler`. The CUDA and NCCL branches are correct by construction but have not run
on a GPU in this project's CI (tests marked ``gpu``).
"""

from __future__ import annotations

import contextlib
import os
import re

import torch
import torch.distributed as dist

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda)(?::([0-9]+))?$")


def resolve_device(spec: str = "auto", *, local_rank: int | None = None) -> torch.device:
    """The ``torch.device`` for ``spec``; raises ``ValueError`` when it is malformed or not present.

    ``local_rank`` (torchrun's ``LOCAL_RANK``) picks this process's GPU for ``auto`` and ``cuda``; an
    explicit ``cuda:N`` under several processes is refused because every rank would share one GPU.
    """
    match = _DEVICE.match(spec) if isinstance(spec, str) else None
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise ValueError(f"--device must be auto, cpu, cuda, cuda:N or mps, got {spec!r}")
    kind, index = match.group(1), match.group(2)
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(
                "--device mps: the MPS backend is not available on this machine; use --device cpu"
            )
        return torch.device("mps")
    if not torch.cuda.is_available():
        build = (
            "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no GPU visible"
        )
        raise ValueError(
            f"--device {spec}: CUDA is not available (torch {torch.__version__}, {build}); "
            "use --device cpu, or install a CUDA build of torch on a machine with a GPU"
        )
    count = torch.cuda.device_count()
    if index is not None:
        if local_rank is not None:
            raise ValueError(
                f"--device {spec} under torchrun: each process uses cuda:LOCAL_RANK; pass --device cuda"
            )
        if int(index) >= count:
            raise ValueError(
                f"--device {spec}: only {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})"
            )
        return torch.device("cuda", int(index))
    rank = local_rank or 0
    if rank >= count:
        raise ValueError(
            f"LOCAL_RANK {rank} has no GPU: {count} CUDA device(s) visible; start at most {count} processes per node"
        )
    return torch.device("cuda", rank)


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision the device cannot autocast to (before any work is done)."""
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bfloat16; use fp16")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Autocast for ``device``'s type in ``precision`` (a no-op context for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=_DTYPES[precision])


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Loss scaling for fp16 (disabled, a pass-through, for fp32 and bf16)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def init_distributed(device_spec: str) -> tuple[int, int, torch.device]:
    """(rank, world size, this process's device); joins the torchrun group (NCCL on CUDA, gloo otherwise)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ["LOCAL_RANK"]) if world > 1 and "LOCAL_RANK" in os.environ else None
    device = resolve_device(device_spec, local_rank=local_rank)
    if world == 1:
        return 0, 1, device
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's collectives and all_gather_object use the current device
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def device_rng_state(device: torch.device) -> torch.Tensor | None:
    """The RNG state of ``device`` when it has its own generator (CUDA, MPS), else None."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    if device.type == "mps":
        return torch.mps.get_rng_state()
    return None


def set_device_rng_state(device: torch.device, state: torch.Tensor | None) -> None:
    """Restore :func:`device_rng_state` (ignored when the checkpoint came from another device type)."""
    if state is None:
        return
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    elif device.type == "mps":
        torch.mps.set_rng_state(state)


def to_device(batch: dict, device: torch.device) -> dict:
    """Every tensor of a collated batch on ``device`` (non-blocking from pinned memory)."""
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()
    }
