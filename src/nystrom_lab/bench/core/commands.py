"""``nystrom bench core``: the Nyström core and module vs HuggingFace, lucidrains and SDPA (:mod:`nystrom_lab.bench.core.driver`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nystrom_lab.argtypes import UsageError
from nystrom_lab.attention_spec import parse
from nystrom_lab.bench.options import or_default

#: options only the core suite takes (the other suites refuse them)
CORE_ONLY = ("impls", "modes", "attention")


def run_core_command(args: argparse.Namespace, markdown: Path | None) -> int:
    """The lead's attention-core benchmark, with the options and defaults of the former `bench attention`."""
    from nystrom_lab.attention_spec import constructor_default
    from nystrom_lab.bench.core.driver import IMPLS, MODES, run

    spec = parse(args.attention or "nystrom")
    if spec["name"] != "nystrom" or set(spec) - {"name", "num_landmarks"}:
        raise UsageError(
            f"--attention {args.attention}: bench core compares Nyström implementations at one landmark"
            " count; give nystrom or nystrom-M"
        )
    landmarks = spec.get("num_landmarks") or constructor_default("nystrom", "num_landmarks")

    lengths = or_default(
        args.lengths,
        ([512, 2048, 8192] if args.quick else [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]),
    )
    impls = or_default(args.impls, IMPLS)
    modes = or_default(args.modes, MODES)
    for name, vals, allowed in (("--impls", impls, IMPLS), ("--modes", modes, MODES)):
        bad = [v for v in vals if v not in allowed]
        if bad:
            raise UsageError(f"{name}: unknown {bad}; choose from {allowed}")
    run(
        lengths=lengths,
        impls=impls,
        modes=modes,
        heads=or_default(args.heads, 8),
        dim_head=or_default(args.dim_head, 64),
        landmarks=landmarks,
        dtype=args.dtype,
        repeats=or_default(args.repeats, 5),
        out_dir=args.out,
        markdown=markdown,
    )
    return 0
