"""Reading other libraries' checkpoint folders (HF Nystromformer, BERT) safely, for the interop converters.

Weights are read with ``safetensors`` or ``torch.load(weights_only=True)`` only: no arbitrary unpickling.
Shard indexes may only name files inside their folder. Our own folders are read by transformers'
``from_pretrained``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

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
            return _shards(folder, index)
    raise CheckpointError(
        f"no weights in {folder}: expected model.safetensors or pytorch_model.bin (or a sharded *.index.json)"
    )


def _shards(folder: Path, index: str) -> list[Path]:
    """The shard files an index names; each must be a plain file name inside ``folder``."""
    try:
        weight_map = json.loads((folder / index).read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{folder / index}: not a valid shard index ({err})") from err
    shards = []
    for name in names:
        # lexical check: HF cache folders hold symlinks into a blob store, so resolving would be wrong
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name or "\\" in name:
            raise CheckpointError(
                f"{folder / index}: weight_map names {name!r}, which is not a file inside {folder};"
                " shard names must be plain file names in the checkpoint folder"
            )
        path = folder / name
        shards.append(path)
    return shards


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
