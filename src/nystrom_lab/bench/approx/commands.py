"""The ``nystrom approx`` command: the approximation error of each attention variant vs exact softmax, and
the paper's Figure 3 (:mod:`nystrom_lab.bench.approx.driver`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nystrom_lab.argtypes import (
    UsageError,
    add_device_option,
    cpu_only,
    existing_file,
    int_in_range,
    positive_int,
    positive_ints,
)
from nystrom_lab.bench.options import add_output_options, command_line, names, or_default

MINILM_LAYERS, MINILM_HEADS = 6, 12  # the bundled all-MiniLM-L6-v2 that `approx` reads q, k, v from
# never docs/ by default (a quick run must not overwrite the committed tables; `--out docs` does)
APPROX_OUT = Path("runs/approx")


def _cmd_approx(args: argparse.Namespace) -> int:
    cpu_only(args, "approx")  # an accuracy sweep, not a timing: the errors do not depend on the device
    from nystrom_lab.bench.approx.driver import METHODS, PARAMS, SYNTH_LENGTHS, TEXT_LENGTHS, run

    methods = or_default(args.methods, METHODS)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UsageError(f"--methods: unknown {bad}; choose from {list(METHODS)}")
    try:
        run(
            text_lengths=tuple(or_default(args.text_lengths, ((256, 512) if args.quick else TEXT_LENGTHS))),
            synth_lengths=tuple(
                or_default(args.synth_lengths, ((512, 1024) if args.quick else SYNTH_LENGTHS))
            ),
            params=tuple(or_default(args.params, ((8, 32, 128) if args.quick else PARAMS))),
            methods=methods,
            trials=or_default(args.trials, (1 if args.quick else 3)),
            layer=args.layer,
            text=args.text,
            fig_n=args.fig_n,
            fig_head=args.fig_head,
            fig_m=args.fig_m,
            seed=args.seed,
            out_dir=args.out,
            markdown=None if args.no_markdown else args.out / "benchmarks.md",
            command=command_line(),
        )
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err)) from err  # option values the parser could not check
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``approx`` to the ``nystrom`` command's sub-parsers."""
    a = subparsers.add_parser(
        "approx",
        help="approximation error of each attention variant vs exact softmax, and the paper's Figure 3",
    )
    a.add_argument(
        "--quick",
        action="store_true",
        help="n = 256, 512 (text) and 512, 1024 (synthetic), m = 8, 32, 128, 1 trial",
    )
    a.add_argument("--text-lengths", type=positive_ints, help="n for the MiniLM family (default 256..2048)")
    a.add_argument(
        "--synth-lengths", type=positive_ints, help="n for the low-rank family (default 512..4096)"
    )
    a.add_argument(
        "--params", type=positive_ints,
        help="the sweep: budgets m of every method (landmarks, projection, window, ...; default 8..256)",
    )  # fmt: skip
    a.add_argument("--methods", type=names, help="comma-separated subset (default all)")
    a.add_argument("--trials", type=positive_int, help="draws of the random methods (default 3, --quick 1)")
    a.add_argument(
        "--layer",
        type=int_in_range(0, MINILM_LAYERS - 1),
        default=2,
        help="MiniLM layer whose q, k, v are used (0..5)",
    )
    a.add_argument(
        "--text", type=existing_file, help="English text to tokenise (default CPython LICENSE.txt)"
    )
    a.add_argument("--fig-n", type=positive_int, default=512, help="tokens shown in the Figure 3 maps")
    a.add_argument(
        "--fig-head",
        type=int_in_range(0, MINILM_HEADS - 1),
        default=0,
        help="MiniLM head shown in Figure 3 (0..11)",
    )
    a.add_argument(
        "--fig-m", type=positive_int, help="landmarks in Figure 3 (default: NystromAttention's num_landmarks)"
    )
    a.add_argument("--seed", type=int, default=0)
    add_output_options(a, APPROX_OUT)
    add_device_option(a, help_="auto (the default) or cpu: errors are measured on the CPU; cuda is refused")
    a.set_defaults(func=_cmd_approx)
