"""argparse value types shared by every command (one definition, one error wording), and the parser class.

A ``type=`` function that raises :class:`argparse.ArgumentTypeError` makes a bad value a usage error
(exit 2) that names the option, before any data is generated or loaded. :class:`UsageError` is the same
kind of error found after parsing (a bad combination of options); :func:`nystrom_lab.cli.main` reports both
as one line ``nystrom: error: ...`` with a hint.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


class UsageError(ValueError):
    """Options that are each valid but not together (found after parsing); reported with exit status 2."""


#: options of earlier versions -> the one name each concept has now (no aliases: they are unknown options,
#: and the error's hint names the new one)
RENAMED = {
    "--init-from-bert": "--init-from", "--from-hf": "--init-from", "--from-pretrain": "--init-from",
    "--model": "--init-from", "--seq-len": "--max-length", "--num-landmarks": "--attention nystrom-M",
    "--landmarks": "--attention nystrom-M", "--conv-kernel": "--attention nystrom,conv_kernel_size=K",
}  # fmt: skip


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the ``nystrom: error: <message>`` line and a ``--help`` hint instead of the usage block.

    Sub-parsers made by ``add_subparsers`` inherit the class, so every command reports alike.
    """

    _argv: tuple[str, ...] = ()

    def parse_known_args(self, args=None, namespace=None):
        self._argv = tuple(sys.argv[1:] if args is None else args)  # for error(): the words this parser read
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        hint = f"`{self.prog} --help` lists the options"
        # an old option name is unknown, or its value then reads as a sub-command: say what replaced it
        old = dict.fromkeys(a.split("=")[0] for a in self._argv if a.split("=")[0] in RENAMED)
        if old:
            hint = "; ".join(f"{a} is now {RENAMED[a]}" for a in old) + f" ({hint})"
        sys.stderr.write(f"nystrom: error: {message}\nhint: {hint}\n")
        sys.exit(2)


def _bad(kind: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {kind}, got {text!r}")


def _int_at_least(text: str, low: int, kind: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise _bad(kind, text) from err
    if value < low:
        raise _bad(kind, text)
    return value


def positive_int(text: str) -> int:
    """An int ≥ 1."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An int ≥ 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def int_in_range(low: int, high: int):
    """A ``type=`` for an int in ``[low, high]``."""

    def parse(text: str) -> int:
        value = _int_at_least(text, low, f"an integer from {low} to {high}")
        if value > high:
            raise _bad(f"an integer from {low} to {high}", text)
        return value

    parse.__name__ = f"int in [{low}, {high}]"
    return parse


def _float_where(text: str, ok: Callable[[float], bool], kind: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise _bad(kind, text) from err
    if not ok(value):
        raise _bad(kind, text)
    return value


def positive_float(text: str) -> float:
    """A finite float > 0 (``inf`` and ``nan`` are refused: a learning rate or a budget must be a number)."""
    return _float_where(text, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def non_negative_float(text: str) -> float:
    """A finite float ≥ 0 (a pause that may be none)."""
    return _float_where(text, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")


def lr_scale_pair(text: str) -> tuple[str, float]:
    """``GLOB=FACTOR`` (``*lm_head*=10``): parameters whose name matches GLOB train at FACTOR × the rate."""
    glob, eq, factor = text.rpartition("=")
    if not eq or not glob:
        raise argparse.ArgumentTypeError(f"expected GLOB=FACTOR (e.g. '*lm_head*=10'), got {text!r}")
    return glob, positive_float(factor)


def open_fraction(text: str) -> float:
    """A float strictly between 0 and 1."""
    return _float_where(text, lambda v: 0.0 < v < 1.0, "a number between 0 and 1 (exclusive)")


def positive_ints(text: str) -> list[int]:
    """Comma-separated ints ≥ 1, at least one."""
    try:
        vals = [int(t) for t in text.split(",") if t]
    except ValueError as err:
        raise _bad("comma-separated integers", text) from err
    if not vals or min(vals) < 1:
        raise _bad("positive integers", text)
    return vals


def _existing(text: str, *, folder: bool) -> Path:
    path = Path(text)
    if path.is_dir() if folder else path.is_file():
        return path
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    raise argparse.ArgumentTypeError(
        f"{text!r} is a {'file, not a folder' if folder else 'folder, not a file'}"
    )


def existing_dir(text: str) -> Path:
    """A folder that exists."""
    return _existing(text, folder=True)


def existing_file(text: str) -> Path:
    """A file that exists."""
    return _existing(text, folder=False)


def output_dir(text: str) -> Path:
    """A folder to write into: it may not exist yet, but it must not be a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a folder (it is created if missing)")
    return path


def output_file(text: str) -> Path:
    """A file to write: not a folder, and its folder must exist."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder of {text!r} does not exist")
    return path


def names_from(allowed: tuple[str, ...] | list[str], *, what: str = "names"):
    """A ``type=`` for comma-separated names, each one of ``allowed`` (at least one)."""

    def parse(text: str) -> tuple[str, ...]:
        vals = tuple(t for t in text.split(",") if t)
        bad = [v for v in vals if v not in allowed]
        if not vals or bad:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {bad or [text]}; choose from {', '.join(allowed)}"
            )
        return vals

    parse.__name__ = what  # argparse names the type in its messages
    return parse


def device(text: str) -> str:
    """A device that exists on this machine (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``), checked at once.

    ``auto`` and ``cpu`` exist everywhere: they are taken without importing torch (``auto``, the default,
    is converted at every parse, help and usage errors included)."""
    if text in ("auto", "cpu"):
        return text
    from nystrom_lab.training.device import resolve_device

    try:
        resolve_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix(f"--device {text}: ")) from err
    return text


DEVICE_HELP = "auto (CUDA when available, default), cpu, cuda, cuda:N or mps; under torchrun cuda:LOCAL_RANK"


def add_device_option(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, help_: str = DEVICE_HELP) -> None:
    """``--device``, the one device option of every command that computes (default ``auto``); ``help_`` says
    what this command does with it (a CPU benchmark refuses cuda)."""
    p.add_argument("--device", type=device, default="auto", help=help_)


def add_device_options(p: argparse.ArgumentParser, *, training: bool = True) -> None:
    """``--device`` (and for training ``--precision``, ``--compile`` and the deprecated ``--bf16``)."""
    add_device_option(p)
    p.add_argument(
        "--precision", choices=("fp32", "bf16", "fp16"), default=None,
        help="fp32 (default); bf16 or fp16 autocast (fp16 with loss scaling)",
    )  # fmt: skip
    if training:
        p.add_argument("--compile", action="store_true", help="torch.compile the model for training")
        p.add_argument("--bf16", action="store_true", help="deprecated: same as --precision bf16")


def device_options(args: argparse.Namespace) -> dict:
    """``{"device", "precision"[, "compile"]}`` from :func:`add_device_options`' arguments."""
    precision = args.precision
    if getattr(args, "bf16", False):
        if precision not in (None, "bf16"):
            raise UsageError(f"--bf16 contradicts --precision {precision}; give only --precision")
        import warnings

        warnings.warn("--bf16 is deprecated; use --precision bf16", FutureWarning, stacklevel=2)
        precision = "bf16"
    opts = {"device": args.device, "precision": precision or "fp32"}
    if hasattr(args, "compile"):
        opts["compile"] = args.compile
    return opts


def cpu_only(args: argparse.Namespace, command: str) -> None:
    """Refuse ``--device`` other than auto or cpu for a command that measures or computes on the CPU only."""
    if args.device not in ("auto", "cpu"):
        raise UsageError(f"nystrom {command} runs on the CPU only; --device {args.device} is not supported")


def cpu_or_cuda(text: str) -> str:
    """``--device`` of a command that runs on ``cpu`` or ``cuda`` (one GPU): auto resolved (imports torch)."""
    from nystrom_lab.training.device import resolve_device

    kind = resolve_device(text).type
    if kind not in ("cpu", "cuda") or text.startswith("cuda:"):
        raise UsageError(f"--device {text}: this command runs on cpu or cuda (auto picks CUDA when available)")
    return kind
