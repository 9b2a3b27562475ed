"""Atomic, safe checkpoints: model weights in safetensors, optimiser/scheduler/RNG state via weights_only.

A checkpoint is a folder. It is written under a temporary name and renamed into place, so a process
killed at any instant leaves either the previous checkpoint or the new one, never a torn one.
Nothing is ever unpickled: state is loaded with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from torch import nn

from nystrom_lab.training.device import device_rng_state, set_device_rng_state


def rng_state(device: torch.device | None = None) -> dict:
    """Python, numpy, torch (CPU) and ``device``'s RNG states as weights_only-loadable objects."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "torch": torch.get_rng_state(),
    }
    dev = device_rng_state(device) if device is not None else None
    if dev is not None:  # CUDA/MPS dropout masks come from the device's own generator
        state["device_type"], state["device"] = device.type, dev.cpu()
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Restore :func:`rng_state`; the device part only on the same device type it was saved from."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(gauss)))
    torch.set_rng_state(state["torch"])
    if device is not None and state.get("device_type") == device.type:
        set_device_rng_state(device, state["device"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    path: Path, *, model: nn.Module, state: dict, meta: dict, rank_states: list[dict] | None = None
) -> None:
    """Write ``path/`` atomically: model.safetensors, state.pt (optimiser etc.), rng{r}.pt, meta.json."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(state, tmp / "state.pt")
    for r, rs in enumerate(rank_states or []):
        torch.save(rs, tmp / f"rng{r}.pt")
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    old = path.with_name(path.name + ".old")
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    if old.exists():
        shutil.rmtree(old)


def find_checkpoint(path: Path) -> Path | None:
    """The complete checkpoint at ``path``, or the previous one if a crash hit between the two renames."""
    path = Path(path)
    for cand in (path, path.with_name(path.name + ".old")):
        if (cand / "meta.json").exists():
            return cand
    return None


def load_checkpoint(path: Path, *, model: nn.Module, rank: int = 0) -> tuple[dict, dict, dict | None]:
    """Load weights into ``model``; return (state, meta, this rank's RNG state or None)."""
    path = Path(path)
    missing = [f for f in ("model.safetensors", "state.pt", "meta.json") if not (path / f).exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {path} is incomplete: missing {missing}")
    try:
        meta = json.loads((path / "meta.json").read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"checkpoint {path}/meta.json is corrupt: {err}") from err
    missing_keys, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    if missing_keys or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model: missing keys {sorted(missing_keys)[:10]}, "
            f"unexpected keys {sorted(unexpected)[:10]}"
        )
    # map_location: a checkpoint written on a GPU loads on any machine (the optimiser then moves its
    # state to the parameters' device in load_state_dict)
    state = torch.load(path / "state.pt", weights_only=True, map_location="cpu")
    rng_file = path / f"rng{rank}.pt"
    rng = torch.load(rng_file, weights_only=True, map_location="cpu") if rng_file.exists() else None
    return state, meta, rng


def save_weights(path: Path, model: nn.Module) -> None:
    """Model weights only (safetensors), atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    save_model(model, str(tmp))
    os.replace(tmp, path)


def load_weights(path: Path, model: nn.Module) -> None:
    missing, unexpected = load_model(model, str(path), strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match the model: missing {sorted(missing)[:10]}, unexpected {sorted(unexpected)[:10]}"
        )
