"""Option types and shared options of the text commands (``pretrain``, ``finetune``, ``predict``).

argparse ``type=`` functions check every value at parse time, before any data is loaded.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from nystrom_lab.argtypes import (
    add_device_options,
    existing_dir,
    existing_file,
    output_dir,
    positive_float,
    positive_int,
)


def dropout(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1), got {text!r}") from err
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1), got {text!r}")
    return value


def kernel(text: str) -> int | None:
    return None if text in ("0", "none") else positive_int(text)


def attention(text: str) -> str:
    """``nystrom-<landmarks>``, ``softmax``, ``linear``, ``linformer-<k>`` or ``performer-<features>``,
    checked at parse time; kept as written (Linformer's sequence length is filled in later)."""
    from nystrom_lab.text.presets import parse_attention

    try:
        parse_attention(text, max_seq_len=1)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--attention ")) from err
    return text


def folder(text: str) -> str:
    """A folder that exists, kept as a string (as the run records store it)."""
    return str(existing_dir(text))


def bert(text: str) -> str:
    """``minilm`` (the bundled all-MiniLM-L6-v2) or a folder that exists."""
    return text if text == "minilm" else folder(text)


def model(text: str) -> str:
    """A model preset name (bert-small, bert-base) or a configuration .json that exists."""
    if text.endswith(".json"):
        return str(existing_file(text))
    from nystrom.model.presets import PRESETS

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(
            f"expected a preset name ({', '.join(sorted(PRESETS))}) or a config .json, got {text!r}"
        )
    return text


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


def add_common(p: argparse.ArgumentParser, *, out_required: bool = True) -> None:
    p.add_argument(
        "--out",
        type=output_dir,
        required=out_required,
        help="output folder (re-running resumes from OUT/last)",
    )
    p.add_argument(
        "--init-from-bert", type=bert, metavar="PATH",
        help="HF BERT folder, or 'minilm' (bundled all-MiniLM-L6-v2)",
    )  # fmt: skip
    p.add_argument(
        "--tokenizer", type=existing_file, help="tokenizer.json (default: the one beside the initialisation)"
    )
    p.add_argument(
        "--conv-kernel", type=kernel, default=65, help="Nyström conv skip taps (0 = none; default 65)"
    )
    p.add_argument("--batch-size", type=positive_int, help="examples per optimiser step (all processes)")
    p.add_argument("--lr", type=positive_float, help="peak learning rate")
    p.add_argument("--dropout", type=dropout, help="override the model's dropout (0 for exact comparisons)")
    p.add_argument("--seed", type=int, default=0, help="initialisation, example order, masks (default 0)")
    add_device_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
