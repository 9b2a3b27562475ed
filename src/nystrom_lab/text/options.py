"""Option types and shared options of the text commands (``pretrain``, ``finetune``, ``predict``).

argparse ``type=`` functions check every value at parse time, before any data is loaded.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from nystrom_lab.argtypes import (
    add_device_options,
    existing_file,
    output_dir,
    positive_float,
    positive_int,
)
from nystrom_lab.attention_spec import attention
from nystrom_lab.start_point import add_init_from
from nystrom_lab.text.presets import PAPER_CONV_KERNEL


def dropout(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1), got {text!r}") from err
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1), got {text!r}")
    return value


def corpus(text: str) -> str:
    """A text file, a folder or a built-in corpus name."""
    from nystrom_lab.data.text_corpus import BUILTIN_CORPORA

    if text in BUILTIN_CORPORA or Path(text).exists():
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} does not exist (nor is it one of {', '.join(BUILTIN_CORPORA)})"
    )


def input_file(text: str) -> str:
    """``-`` (standard input) or a file that exists."""
    return text if text == "-" else str(existing_file(text))


def run_folder(out: Path):
    from nystrom_lab.training.runlock import hold_run_folder

    return hold_run_folder(out)  # before the data: a second run into OUT refuses at once


def is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


#: what a text command's --attention does, for its help
ATTENTION_HELP = (
    "attention spec NAME[-M][,key=value,...], e.g. nystrom, nystrom-64,conv_kernel_size=none, softmax,"
    f" linformer-256 (a Nyström spec without conv_kernel_size gets {PAPER_CONV_KERNEL}, the paper's BERT"
    " setting; other unset keys: the constructor's defaults). Default: the start point's own (a BERT"
    " folder's: nystrom)"
)


def add_common(p: argparse.ArgumentParser, *, init_from: str, what: str) -> None:
    """The options pretrain and finetune share; ``init_from``: the default start point, ``what`` it is for."""
    p.add_argument("--out", type=output_dir, help="output folder (re-running resumes from OUT/last)")
    add_init_from(p, default=init_from, what=what)
    p.add_argument("--attention", type=attention, metavar="SPEC", help=ATTENTION_HELP)
    p.add_argument(
        "--tokenizer", type=existing_file, help="tokenizer.json (default: the one beside the start point)"
    )
    p.add_argument("--batch-size", type=positive_int, help="examples per optimiser step (all processes)")
    p.add_argument("--lr", type=positive_float, help="peak learning rate")
    p.add_argument("--dropout", type=dropout, help="override the model's dropout (0 for exact comparisons)")
    p.add_argument("--seed", type=int, default=0, help="initialisation, example order, masks (default 0)")
    add_device_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
