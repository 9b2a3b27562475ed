"""The ``nystrom bench`` command: Table 1, the core, training and whole-model benchmarks.

``register(subparsers)`` adds it to the top-level parser of :mod:`nystrom_lab.cli` (``nystrom approx`` is
:mod:`nystrom_lab.bench.approx_commands`, which shares this module's option helpers).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from nystrom_lab.argtypes import (
    UsageError,
    add_device_option,
    cpu_only,
    cpu_or_cuda,
    output_dir,
    positive_float,
    positive_int,
    positive_ints,
)
from nystrom_lab.attention_spec import attention, parse
from nystrom_lab.bench.malloc import MALLOC

# default output folders: never docs/ (a quick run must not overwrite the committed tables; `--out docs` does)
BENCH_OUT = Path("runs/bench")
# options that belong to one suite only; naming one for the other suite is an error, not ignored
_TABLE1_ONLY = ("batch", "methods", "backward", "max_n", "max_exact_n", "budget", "threads", "fresh_process")
_CORE_ONLY = ("impls", "modes", "attention")
# what `bench training` does not take: its sizes are the paper's and TransMIL's regimes
_NOT_TRAINING = (*_TABLE1_ONLY, "modes", "attention", "lengths", "heads", "dim_head")
_TRAINING_ONLY = ("malloc",)


def or_default(value, default):
    """The option's value, or the suite's default when the option was not given (None)."""
    return default if value is None else value


def names(text: str) -> tuple[str, ...]:
    return tuple(t for t in text.split(",") if t)


def command_line() -> str:
    return "nystrom " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _cmd_bench(args: argparse.Namespace) -> int:
    from nystrom_lab.bench.models_commands import MODELS_ONLY

    wrong = {
        "table1": (*_CORE_ONLY, *_TRAINING_ONLY, *MODELS_ONLY),
        "core": (*_TABLE1_ONLY, *_TRAINING_ONLY, *MODELS_ONLY),
        "training": (*_NOT_TRAINING, *MODELS_ONLY),
        "models": (*(o for o in _NOT_TRAINING if o not in ("lengths", "device", "threads")), *_TRAINING_ONLY),
        "launches": (*(o for o in _NOT_TRAINING if o != "lengths"), *_TRAINING_ONLY, *MODELS_ONLY, "repeats"),
    }[args.suite]
    given = [f"--{o.replace('_', '-')}" for o in wrong if getattr(args, o) not in (None, False)]
    if args.suite == "training" and args.dtype != "float32":
        given.append("--dtype")
    if given:
        raise UsageError(f"nystrom bench {args.suite}: option(s) {given} do not apply to this suite")
    if args.suite in ("core", "training"):
        cpu_only(args, f"bench {args.suite}")  # they measure CPU kernels, allocators and threads
    if args.suite == "models":
        from nystrom_lab.bench.models_commands import cmd

        return cmd(args)
    if args.suite == "launches":
        return _bench_launches(args)
    markdown = None if args.no_markdown else args.out / "benchmarks.md"
    if args.suite == "core":
        return _bench_core(args, markdown)
    if args.suite == "training":
        return _bench_training(args, markdown)
    from nystrom_lab.bench.table1 import DEFAULT_METHODS, LENGTHS, METHODS, QUICK_LENGTHS, run

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


def _bench_launches(args: argparse.Namespace) -> int:
    """Ops dispatched per forward and forward + backward on the meta device, ours vs HF."""
    if args.device != "auto" or args.dtype != "float32" or args.quick:
        raise UsageError("nystrom bench launches counts float32 ops on the meta device (the accelerator path):"
                         " --device, --dtype and --quick do not apply")  # fmt: skip
    lengths = or_default(args.lengths, (4096,))
    if len(lengths) != 1:
        raise UsageError(f"nystrom bench launches counts one length at a time, got --lengths {lengths}")
    from nystrom_lab.bench.launches_cases import run

    report = run(n=lengths[0], out_dir=args.out)
    print((args.out / "launches.md").read_text(), end="")
    print(f"data: {args.out / 'launches.json'} (commit {report['commit']})")
    return 0


def _bench_core(args: argparse.Namespace, markdown: Path | None) -> int:
    """The lead's attention-core benchmark, with the options and defaults of the former `bench attention`."""
    from nystrom_lab.attention_spec import constructor_default
    from nystrom_lab.bench.attention import IMPLS, MODES, run

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


def _bench_training(args: argparse.Namespace, markdown: Path | None) -> int:
    """Forward, backward and peak memory in training (paper and TransMIL regimes) + one ListOps step."""
    from nystrom_lab.bench.training import IMPLS, run

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


def add_output_options(p: argparse.ArgumentParser, default: Path) -> None:
    """``--out`` (``default``: under runs/, never docs/) and ``--no-markdown`` of a benchmark command."""
    p.add_argument(
        "--out", type=output_dir, default=default,
        help=f"folder for CSV/markdown/PNG and benchmarks.md (default {default}; --out docs updates the"
        " committed tables)",
    )  # fmt: skip
    p.add_argument("--no-markdown", action="store_true", help="do not update OUT/benchmarks.md")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` to the ``nystrom`` command's sub-parsers."""

    b = subparsers.add_parser(
        "bench",
        help="benchmarks, each case in a fresh process: the paper's Table 1 (default), the core or training",
        description="table1: memory/time of one input through each self-attention module (the paper's "
        "Table 1). core: Nyström core/module vs HuggingFace, lucidrains and SDPA. training: forward, "
        "backward and peak memory of one layer in the paper's and TransMIL's regimes, and one ListOps "
        "training step, ours vs HuggingFace, lucidrains and SDPA (interleaved rounds). models: whole encoders "
        "(ours Nyström/exact vs transformers' Nystromformer, Longformer, BigBird, BERT), inference and a "
        "training step at 512-16K tokens. launches: ops dispatched per forward and forward + backward on "
        "the meta device (a CPU proxy for GPU kernel launches), ours vs transformers' Nystromformer.",
    )
    b.add_argument(
        "suite", nargs="?", default="table1", choices=("table1", "core", "training", "models", "launches")
    )
    b.add_argument(
        "--lengths", type=positive_ints, help="comma-separated n (table1: 512..16384; core: 512..65536)"
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="table1: n = 512, 2048, 4096, 3 repeats; core: 512, 2048, 8192; training: toy sizes in one "
        "process (a smoke test)",
    )
    b.add_argument("--heads", type=positive_int, help="table1: 12 (BERT-base, the paper); core: 8")
    b.add_argument("--dim-head", type=positive_int, help="default 64")
    b.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    b.add_argument(
        "--repeats",
        type=positive_int,
        help="timed calls per case, median (default 5; table1 --quick 3); training: interleaved rounds",
    )
    add_output_options(b, BENCH_OUT)
    add_device_option(
        b, help_="auto (CUDA when available, default), cpu or cuda: table1 and models run there; core and"
        " training measure the CPU (they refuse cuda)",
    )  # fmt: skip
    t = b.add_argument_group("table1 only")
    t.add_argument(
        "--methods", type=names, help="comma-separated subset of the Table 1 methods (default all)"
    )
    t.add_argument("--batch", type=positive_int, help="inputs per call (default 1, as the paper)")
    t.add_argument(
        "--backward", action="store_true", help="forward + backward of out.sum() instead of forward"
    )
    t.add_argument("--max-n", type=positive_int, help="longest n for the approximate methods (default 16384)")
    t.add_argument(
        "--max-exact-n", type=positive_int, help="longest n for Transformer and SDPA (default 8192)"
    )
    t.add_argument(
        "--budget", type=positive_float, help="seconds of timed calls per case (default 20; --quick 3)"
    )
    t.add_argument("--threads", type=positive_int, help="CPU threads per case (default: torch's default)")
    t.add_argument(
        "--fresh-process",
        action="store_true",
        help="start a new interpreter per case instead of forking each from one worker (seconds more a case)",
    )
    c = b.add_argument_group("core only")
    c.add_argument(
        "--impls", type=names, help="comma-separated subset of nystrom,hf,lucidrains,sdpa (core, training)"
    )
    c.add_argument("--modes", type=names, help="comma-separated subset of core,fwd,fwdbwd")
    c.add_argument(
        "--attention", type=attention, metavar="SPEC",
        help="nystrom or nystrom-M: the landmarks every implementation uses (default: NystromAttention's)",
    )  # fmt: skip
    from nystrom_lab.bench.models_commands import add_options

    add_options(b)  # models: whole long-document encoders, ours vs transformers'
    r = b.add_argument_group("training only")
    r.add_argument(
        "--malloc",
        choices=tuple(MALLOC),  # bench.measure.MALLOC: the one list of modes
        help="the cases' C allocator: system (default: as set up; glibc maps blocks of ≥ 32 MiB fresh, "
        "so their first touch page-faults in every call) or cached (glibc keeps freed memory, as a "
        "caching allocator would); a cached run writes its own json, png and markdown section",
    )
    b.set_defaults(func=_cmd_bench)
