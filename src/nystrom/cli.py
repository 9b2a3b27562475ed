"""The `nystrom` command line: demo, benchmarks, data generation and the experiments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _ints(text: str) -> list[int]:
    try:
        vals = [int(t) for t in text.split(",") if t]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _cmd_demo(args: argparse.Namespace) -> int:
    from nystrom.demo import main

    return main(quick=args.quick)


def _cmd_bench_attention(args: argparse.Namespace) -> int:
    from nystrom.bench.attention import IMPLS, MODES, run

    lengths = args.lengths or (
        [512, 2048, 8192] if args.quick else [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
    )
    impls = tuple(args.impls.split(",")) if args.impls else IMPLS
    modes = tuple(args.modes.split(",")) if args.modes else MODES
    for name, vals, allowed in (("--impls", impls, IMPLS), ("--modes", modes, MODES)):
        bad = [v for v in vals if v not in allowed]
        if bad:
            raise SystemExit(f"{name}: unknown {bad}; choose from {allowed}")
    run(
        lengths=lengths,
        impls=impls,
        modes=modes,
        heads=args.heads,
        dim_head=args.dim_head,
        landmarks=args.landmarks,
        dtype=args.dtype,
        repeats=args.repeats,
        out_dir=args.out,
        markdown=None if args.no_markdown else args.out / "benchmarks.md",
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nystrom", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser(
        "demo", help="correctness checks vs exact attention and a quick timing (about a minute)"
    )
    d.add_argument("--quick", action="store_true", help="fewer lengths")
    d.set_defaults(func=_cmd_demo)

    bench = sub.add_parser("bench", help="benchmarks (each case in a fresh process)")
    bsub = bench.add_subparsers(dest="bench", required=True)
    ba = bsub.add_parser("attention", help="core/module time and memory vs HF, lucidrains and SDPA")
    ba.add_argument("--lengths", type=_ints, help="comma-separated n (default 512..65536)")
    ba.add_argument("--quick", action="store_true", help="n = 512, 2048, 8192")
    ba.add_argument("--impls", help="comma-separated subset of nystrom,hf,lucidrains,sdpa")
    ba.add_argument("--modes", help="comma-separated subset of core,fwd,fwdbwd")
    ba.add_argument("--heads", type=int, default=8)
    ba.add_argument("--dim-head", type=int, default=64)
    ba.add_argument("--landmarks", type=int, default=64)
    ba.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    ba.add_argument("--repeats", type=int, default=5, help="timed runs per case (median)")
    ba.add_argument("--out", type=Path, default=Path("docs"), help="folder for the CSV and benchmarks.md")
    ba.add_argument("--no-markdown", action="store_true", help="do not update OUT/benchmarks.md")
    ba.set_defaults(func=_cmd_bench_attention)

    from nystrom.data.lra.commands import register as register_data

    register_data(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
