"""``nystrom bench training``: one attention layer in training, and one ListOps step (:mod:`nystrom_lab.bench.training.driver`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nystrom_lab.argtypes import UsageError
from nystrom_lab.bench.options import command_line, or_default

#: options only the training suite takes (the other suites refuse them)
TRAINING_ONLY = ("malloc",)


def run_training_command(args: argparse.Namespace, markdown: Path | None) -> int:
    """Forward, backward and peak memory in training (paper and TransMIL regimes) + one ListOps step."""
    from nystrom_lab.bench.training.driver import IMPLS, run

    impls = or_default(args.impls, IMPLS)
    bad = [v for v in impls if v not in IMPLS]
    if bad or "nystrom" not in impls:
        raise UsageError(f"--impls: unknown {bad} or nystrom missing; choose from {IMPLS} (nystrom required)")
    try:
        run(
            quick=args.quick,
            impls=impls,
            rounds=args.repeats,
            out_dir=args.out,
            markdown=markdown,
            command=command_line(),
            malloc=args.malloc or "system",
        )
    except ValueError as err:
        raise UsageError(str(err)) from err  # --malloc where it cannot take effect
    return 0
