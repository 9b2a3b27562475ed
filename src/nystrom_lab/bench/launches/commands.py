"""``nystrom bench launches``: ops dispatched per call on the meta device, ours vs HF (:mod:`nystrom_lab.bench.launches.cases`)."""

from __future__ import annotations

import argparse

from nystrom_lab.argtypes import UsageError
from nystrom_lab.bench.options import or_default


def run_launches_command(args: argparse.Namespace) -> int:
    """Ops dispatched per forward and forward + backward on the meta device, ours vs HF."""
    if args.device != "auto" or args.dtype != "float32" or args.quick:
        raise UsageError("nystrom bench launches counts float32 ops on the meta device (the accelerator path):"
                         " --device, --dtype and --quick do not apply")  # fmt: skip
    lengths = or_default(args.lengths, (4096,))
    if len(lengths) != 1:
        raise UsageError(f"nystrom bench launches counts one length at a time, got --lengths {lengths}")
    from nystrom_lab.bench.launches.cases import run

    report = run(n=lengths[0], out_dir=args.out)
    print((args.out / "launches.md").read_text(), end="")
    print(f"data: {args.out / 'launches.json'} (commit {report['commit']})")
    return 0
