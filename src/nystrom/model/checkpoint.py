"""Reading and writing weight files safely, strict state-dict matching, and the native checkpoint format.

Weights are read with ``safetensors`` or ``torch.load(weights_only=True)`` only: no arbitrary unpickling.
A native checkpoint folder holds ``config.json`` ``{"format": "nystrom", "architecture": <class>,
"config": {...}}`` and ``model.safetensors`` with our own parameter names.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

NATIVE_FORMAT = "nystrom"
_SHOW = 12  # how many names an error message lists before summarising


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or does not match the model."""


def _names(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOW])
    return f"{shown}, ... ({len(keys)} in all)" if len(keys) > _SHOW else shown


def weight_files(folder: str | Path) -> list[Path]:
    """The weight file(s) of an HF-style folder: ``model.safetensors`` or ``pytorch_model.bin``, or the
    shards listed by their ``*.index.json``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist or is not a directory")
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            try:
                weight_map = json.loads((folder / index).read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise CheckpointError(f"{folder / index}: not a valid shard index ({err})") from err
            return [folder / name for name in sorted(set(weight_map.values()))]
    raise CheckpointError(
        f"no weights in {folder}: expected model.safetensors or pytorch_model.bin (or a sharded *.index.json)"
    )


def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder on CPU, name -> tensor."""
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        if not path.is_file():
            raise CheckpointError(f"weight shard {path} listed in the index is missing")
        try:
            if path.suffix == ".safetensors":
                part = load_file(str(path), device="cpu")
            else:
                part = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # corrupt files raise many different types
            raise CheckpointError(f"cannot read weights from {path}: {type(err).__name__}: {err}") from err
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise CheckpointError(f"{path} does not hold a flat name -> tensor state dict")
        state.update(part)
    return state


def load_strict(model: nn.Module, state: dict[str, torch.Tensor], *, source: str) -> None:
    """Copy ``state`` into ``model``; any missing/unexpected key or shape mismatch is one clear error."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if state[k].shape != own[k].shape
    ]
    copy_checked(model, state, missing=missing, unexpected=unexpected, shapes=shapes, source=source)


def copy_checked(
    model: nn.Module,
    tensors: dict[str, torch.Tensor],
    *,
    missing: list[str],
    unexpected: list[str],
    shapes: list[str],
    source: str,
) -> None:
    """Raise one error listing every key problem, or copy ``tensors`` (model key -> tensor) into ``model``."""
    problems = []
    if missing:
        problems.append(f"missing keys: {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_names(unexpected)}")
    if shapes:
        problems.append(f"shape mismatches: {_names(shapes)}")
    if problems:
        raise CheckpointError(f"{source} does not match {type(model).__name__}: " + "; ".join(problems))
    with torch.no_grad():
        for k, t in model.state_dict().items():
            t.copy_(tensors[k].to(t.dtype))


def read_json(path: Path) -> dict:
    if not path.parent.is_dir():
        raise CheckpointError(f"checkpoint folder {path.parent} does not exist or is not a directory")
    if not path.is_file():
        raise CheckpointError(f"{path} not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def save_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Write ``model`` (any Nystromformer* class) as a native checkpoint folder ``path``."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format": NATIVE_FORMAT, "architecture": type(model).__name__, "config": model.config.to_dict()}
    (folder / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def load_checkpoint(path: str | Path) -> nn.Module:
    """Load a folder written by :func:`save_checkpoint`; returns the saved class, in eval mode."""
    from nystrom.model.config import NystromformerConfig
    from nystrom.model.heads import MODEL_CLASSES

    folder = Path(path)
    meta = read_json(folder / "config.json")
    if meta.get("format") != NATIVE_FORMAT:
        raise CheckpointError(
            f'{folder / "config.json"} is not a native nystrom checkpoint (no "format": "nystrom");'
            " for HuggingFace folders use nystrom.from_hf / nystrom.from_bert"
        )
    arch = meta.get("architecture")
    if arch not in MODEL_CLASSES:
        raise CheckpointError(
            f"{folder / 'config.json'}: architecture must be one of {sorted(MODEL_CLASSES)}, got {arch!r}"
        )
    config = NystromformerConfig.from_dict(meta.get("config"), source=f"{folder / 'config.json'} [config]")
    model = MODEL_CLASSES[arch](config)
    load_strict(model, read_weights(folder), source=str(folder))
    return model.eval()
