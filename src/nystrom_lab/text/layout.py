"""How ``nystrom pretrain`` lays examples out in rows (``--packing``), and which layout a run gets.

Layouts (one option, ``--packing``):

- ``documents``: examples packed into ``--max-length`` rows, each attending only to itself
  (:mod:`nystrom_lab.data.packing`): whole documents for ``--objective mlm`` (a longer one cut into
  pieces that are documents of their own), sentence pairs for MLM + SOP. The default wherever the model
  can keep packed documents apart: its forward takes ``cu_seq_lens_q`` and every attention layer packs
  exactly (Nyström and softmax attention; :attr:`nystrom.attention.AttentionBase.packs_documents`).
- ``stream`` (``--objective mlm`` only): the documents concatenated with ``[SEP]`` and cut into rows, so a
  row's documents attend to each other (the long-context experiment's layout before packing; kept to
  reproduce it). The fallback of MLM when the model cannot pack.
- ``off``: one example per row, padded (BERT's layout; the fallback of MLM + SOP).

A run records its layout (``pretrain_run.json``, ``run.json``); a resumed run without ``--packing`` keeps
the recorded one, and records written before the option meant the fallback of their objective.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the commands import this module to parse: no torch before a run needs it
    from torch import nn

LAYOUTS = ("documents", "stream", "off")
#: the layout each objective had before packing (and falls back to where the model cannot pack)
UNPACKED = {"mlm": "stream", "mlm+sop": "off"}


def check_layout(layout: str | None, objective: str) -> None:
    """Refuse a layout the objective cannot take (None: the default, chosen when the model is built)."""
    if layout is None:
        return
    if layout not in LAYOUTS:
        raise ValueError(f"--packing must be one of {LAYOUTS}, got {layout!r}")
    if layout == "stream" and objective != "mlm":
        raise ValueError(
            "--packing stream applies to --objective mlm only (MLM + SOP examples are sentence pairs);"
            " use --packing documents or off"
        )


def packing_blocker(model: nn.Module) -> str | None:
    """Why ``model`` cannot run packed documents without cross-talk (None: it can)."""
    from nystrom.attention import AttentionBase

    base = getattr(model, "nystromformer", model)
    params = inspect.signature(base.forward).parameters
    if "cu_seq_lens_q" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return f"{type(base).__name__}.forward takes no cu_seq_lens_q (packed documents) in this nystrom"
    for name, module in model.named_modules():
        if isinstance(module, AttentionBase) and not module.packs_documents:
            return (
                f"its attention {type(module).__name__} ({name}) cannot keep packed documents apart"
                " (Nyström and softmax attention can)"
            )
    return None


def recorded_layout(out: Path) -> str | None:
    """The layout of the run already in ``out`` (None: no run there yet)."""
    path = Path(out) / "pretrain_run.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError:
        return None  # a damaged record: the run's own check reports it
    return record.get("packing") or UNPACKED[record.get("objective") or "mlm+sop"]


def choose_layout(requested: str | None, objective: str, model: nn.Module, *, out: Path) -> str:
    """The layout of a run: ``requested`` (``--packing``), else the one recorded in ``out`` (a resumed run),
    else ``documents`` when ``model`` can pack and the objective's unpacked layout when it cannot."""
    check_layout(requested, objective)
    layout = requested or recorded_layout(out)
    blocker = packing_blocker(model)
    if layout == "documents" and blocker is not None:
        raise ValueError(
            f"--packing documents: {blocker}; train with --packing {UNPACKED[objective]} (unpacked) or"
            " another --attention (nystrom, softmax)"
        )
    if layout is None:
        layout = "documents" if blocker is None else UNPACKED[objective]
        if blocker is not None and int(os.environ.get("RANK", "0")) == 0:
            print(f"[nystrom] not packing documents ({blocker}): --packing {layout}")
    return layout
