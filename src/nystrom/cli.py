"""The `nystrom` command line: demo, benchmarks, data generation and the experiments."""

from __future__ import annotations

import argparse
import sys


def _cmd_demo(args: argparse.Namespace) -> int:
    from nystrom.demo import main

    return main(quick=args.quick)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nystrom", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser(
        "demo", help="correctness checks vs exact attention and a quick timing (about a minute)"
    )
    d.add_argument("--quick", action="store_true", help="fewer lengths")
    d.set_defaults(func=_cmd_demo)

    from nystrom.bench.commands import register as register_bench
    from nystrom.data.lra.commands import register as register_data
    from nystrom.tasks.lra_commands import register as register_lra
    from nystrom.tasks.text_commands import register as register_text

    register_bench(sub)
    register_lra(sub)
    register_text(sub)

    register_data(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code = int(args.func(args) or 0)
    if "nystrom.training.loop" in sys.modules:  # a training command ran: leave its torchrun group cleanly
        from nystrom.training.loop import shutdown_distributed

        shutdown_distributed()
    return code


if __name__ == "__main__":
    sys.exit(main())
