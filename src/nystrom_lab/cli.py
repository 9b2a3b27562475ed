"""The `nystrom` command line: demo, benchmarks, data generation and the experiments.

Errors: a failure prints one line ``nystrom: error: <message>`` and, where it helps, a ``hint:`` line.
Exit status 2 for usage errors (a bad option or combination of options), 130 after Ctrl-C, 1 otherwise.
The full traceback is printed only with ``--debug`` (anywhere on the command line) or ``NYSTROM_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from nystrom_lab.argtypes import ArgumentParser, UsageError, add_device_option, cpu_only

_DEBUG_HINT = "run again with --debug (or NYSTROM_DEBUG=1) for the full traceback"


def _cmd_demo(args: argparse.Namespace) -> int:
    cpu_only(args, "demo")  # its timings are CPU timings (no device synchronisation)
    from nystrom_lab.demo import main

    return main(quick=args.quick)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="nystrom", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--debug", action="store_true", help="print the full traceback of an error")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser(
        "demo", help="correctness checks vs exact attention and a quick timing (about a minute)"
    )
    d.add_argument("--quick", action="store_true", help="fewer lengths")
    add_device_option(d, help_="auto (the default) or cpu: the demo times the CPU; cuda is refused")
    d.set_defaults(func=_cmd_demo)

    from nystrom_lab.bench.approx.commands import register as register_approx
    from nystrom_lab.bench.bench_commands import register as register_bench
    from nystrom_lab.data.lra.commands import register as register_data
    from nystrom_lab.docs.commands import register as register_docs
    from nystrom_lab.long_context.commands import register as register_long_context
    from nystrom_lab.lra.commands import register as register_lra
    from nystrom_lab.text.convert import register as register_convert
    from nystrom_lab.text.finetune_commands import register as register_finetune
    from nystrom_lab.text.pretrain_commands import register as register_pretrain

    register_bench(sub)
    register_approx(sub)
    register_lra(sub)
    # `nystrom pretrain ...`, `pretrain figure5`, `pretrain long-context` and `nystrom plot-runs`
    register_long_context(register_pretrain(sub))
    register_finetune(sub)  # `nystrom finetune ...` and `nystrom predict ...`
    register_convert(sub)  # `nystrom convert ...`: folders for transformers
    register_data(sub)
    register_docs(sub)  # `nystrom docs render|check`: the measured tables of README.md and docs/ from data
    return p


def _debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """Whether ``--debug`` (before any ``--``) or ``NYSTROM_DEBUG`` asks for tracebacks; argv without the flag."""
    end = argv.index("--") if "--" in argv else len(argv)
    flag = "--debug" in argv[:end]
    rest = [a for a in argv[:end] if a != "--debug"] + argv[end:]
    env = os.environ.get("NYSTROM_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    return flag or env, rest


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean bad input, a bad environment or a refused run folder: reported without traceback.

    ValueError covers our validation errors (and the data and checkpoint error types, which derive from
    it), bad JSON and undecodable files; TypeError our type checks of options and configurations; OSError
    missing, unreadable or full paths. The torch and run-folder types count only once those modules are
    loaded (an error raised before cannot be one of them), so a usage error never waits for torch.
    """
    errors: tuple[type[BaseException], ...] = (
        ValueError, TypeError, OSError, FloatingPointError, MemoryError, ImportError,
    )  # fmt: skip
    runlock, torch = sys.modules.get("nystrom_lab.training.runlock"), sys.modules.get("torch")
    if runlock is not None:
        errors += (runlock.RunFolderInUseError,)
    if torch is not None:
        errors += (torch.cuda.OutOfMemoryError,)
    return errors


def _hint(err: BaseException, command: str) -> str:
    runlock, torch = sys.modules.get("nystrom_lab.training.runlock"), sys.modules.get("torch")
    if isinstance(err, UsageError):
        return f"`nystrom {command} --help` lists the options"
    if runlock is not None and isinstance(err, runlock.RunFolderInUseError):
        return "wait for that run to finish, or give another --out"
    if isinstance(err, MemoryError) or (torch is not None and isinstance(err, torch.cuda.OutOfMemoryError)):
        return "reduce --batch-size (or the sequence length)"
    if isinstance(err, ModuleNotFoundError):
        return f"install the missing package ({err.name}) into this environment"
    return _DEBUG_HINT


def _report(err: BaseException, *, command: str, debug: bool) -> int:
    """Print the one-line error (and the traceback when ``debug``); the exit status."""
    if debug:
        traceback.print_exception(err)
    if isinstance(err, KeyboardInterrupt):
        sys.stderr.write(
            "nystrom: interrupted\nhint: a training run resumes from its last checkpoint (OUT/last) "
            "when the same command is run again\n"
        )
        return 130
    message = str(err).strip().replace("\n", " ") or type(err).__name__
    if isinstance(err, _user_errors()):
        hint = _hint(err, command)
        code = 2 if isinstance(err, UsageError) else 1
    else:  # anything else is a bug in nystrom (or in a library under it), not the user's input
        message = f"internal error ({type(err).__name__}: {message})"
        where = "above" if debug else "(run again with --debug or NYSTROM_DEBUG=1)"
        hint = f"this is a bug in nystrom; please report it with the full traceback {where}"
        code = 1
    sys.stderr.write(f"nystrom: error: {message}\n")
    if hint and not (debug and hint == _DEBUG_HINT):
        sys.stderr.write(f"hint: {hint}\n")
    return code


def run_command(argv: list[str]) -> int:
    """Parse ``argv`` and run the command, letting its errors propagate (for tests and callers that handle
    them); the exit status. :func:`main` is this plus the one-line error report."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    finally:
        _leave_distributed()


def _leave_distributed() -> None:
    if "nystrom_lab.training.loop" in sys.modules:  # a training command ran: leave its torchrun group cleanly
        from nystrom_lab.training.loop import shutdown_distributed

        shutdown_distributed()


def main(argv: list[str] | None = None) -> int:
    """Run one ``nystrom`` command (``argv`` default: ``sys.argv[1:]``); returns the exit status."""
    debug, argv = _debug_requested(list(sys.argv[1:] if argv is None else argv))
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # argparse has printed the error (status 2) or the help (status 0)
        return int(done.code or 0)
    try:
        code = int(args.func(args) or 0)
    except (Exception, KeyboardInterrupt) as err:
        return _report(err, command=args.command, debug=debug)
    _leave_distributed()
    return code


if __name__ == "__main__":
    sys.exit(main())
