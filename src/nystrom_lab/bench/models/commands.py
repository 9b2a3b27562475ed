"""``nystrom bench models``: the options of the whole-model suite and its command (the cases
live in :mod:`nystrom_lab.bench.models.cases`, the driver in :mod:`nystrom_lab.bench.models.driver`)."""

from __future__ import annotations

import argparse

from nystrom_lab.argtypes import UsageError, cpu_or_cuda, positive_int
from nystrom_lab.bench.options import names

#: options only the models suite takes (the other suites refuse them)
MODELS_ONLY = ("size", "batches", "models", "model_modes", "rounds")
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(positive_int(t) for t in text.split(",") if t)


def add_options(b: argparse.ArgumentParser) -> None:
    """The option group of the models suite, on the ``nystrom bench`` parser."""
    g = b.add_argument_group(
        "models only (also: --lengths, --repeats, --dtype, --device, --threads, --quick, --out)"
    )
    g.add_argument(
        "--size",
        choices=("minilm", "base"),
        help="encoder size: minilm (6 × 384, default) or base (12 × 768)",
    )
    g.add_argument("--batches", type=_ints, help="comma-separated batch sizes (default 1,4; --quick 1)")
    g.add_argument("--models", type=names, help="comma-separated subset of the models (default all)")
    g.add_argument(
        "--model-modes", type=names, help="comma-separated subset of inference,train (default both)"
    )
    g.add_argument("--rounds", type=positive_int, help="interleaved rounds (default 3; --quick 1)")


def run_models_command(args: argparse.Namespace) -> int:
    """Whole encoders side by side, inference and a training step, in interleaved fresh-process rounds."""
    from nystrom_lab.bench.models.cases import MODELS, MODES
    from nystrom_lab.bench.models.driver import run

    models = args.models or MODELS
    modes = args.model_modes or MODES
    bad = [m for m in models if m not in MODELS] + [m for m in modes if m not in MODES]
    if bad:
        raise UsageError(f"unknown {bad}: --models from {list(MODELS)}, --model-modes from {list(MODES)}")
    if args.dtype not in DTYPES:
        raise UsageError(f"nystrom bench models runs {sorted(DTYPES)}, not --dtype {args.dtype}")
    quick = args.quick
    lengths = args.lengths or ((512, 4096) if quick else (512, 4096, 8192, 16384))
    report = run(
        size=args.size or "minilm", lengths=tuple(lengths), batches=args.batches or ((1,) if quick else (1, 4)),
        models=tuple(models), modes=tuple(modes), rounds=args.rounds or (1 if quick else 3),
        repeats=args.repeats or (1 if quick else 2), dtype=DTYPES[args.dtype], device=cpu_or_cuda(args.device),
        threads=args.threads or 0, out_dir=args.out,
    )  # fmt: skip
    print((args.out / "bench_models.md").read_text())
    print(f"data: {args.out / 'bench_models.json'} ({report['wall_s']:.0f} s)")
    return 0
