"""``nystrom bench`` / ``nystrom bench table1``: the paper's Table 1 (:mod:`nystrom_lab.bench.table1.driver`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nystrom_lab.argtypes import UsageError, cpu_or_cuda
from nystrom_lab.bench.options import command_line, or_default

#: options only the table1 suite takes (the other suites refuse them)
TABLE1_ONLY = ("batch", "methods", "backward", "max_n", "max_exact_n", "budget", "threads", "fresh_process")


def run_table1_command(args: argparse.Namespace, markdown: Path | None) -> int:
    """Memory and time of one input through each self-attention module, each case in a fresh process."""
    from nystrom_lab.bench.table1.driver import DEFAULT_METHODS, LENGTHS, METHODS, QUICK_LENGTHS, run

    methods = or_default(args.methods, DEFAULT_METHODS)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UsageError(f"--methods: unknown {bad}; choose from {list(METHODS)}")
    try:
        run(
            lengths=or_default(args.lengths, (QUICK_LENGTHS if args.quick else LENGTHS)),
            methods=methods,
            batch=or_default(args.batch, 1),
            heads=or_default(args.heads, 12),
            dim_head=or_default(args.dim_head, 64),
            dtype=args.dtype,
            device=cpu_or_cuda(args.device),
            backward=args.backward,
            max_n=or_default(args.max_n, 16384),
            max_exact_n=or_default(args.max_exact_n, 8192),
            repeats=or_default(args.repeats, (3 if args.quick else 5)),
            budget_s=or_default(args.budget, (3.0 if args.quick else 20.0)),
            threads=or_default(args.threads, 0),
            out_dir=args.out,
            markdown=markdown,
            command=command_line(),
            fresh_process=args.fresh_process,
        )
    except ValueError as err:
        raise UsageError(str(err)) from err  # option values the parser could not check
    return 0
