"""The ``nystrom bench`` command: Table 1, the core, training and whole-model benchmarks.

``register(subparsers)`` adds it to the top-level parser of :mod:`nystrom_lab.cli`; each suite's command is
in its folder's ``commands`` module (``nystrom approx`` too: :mod:`nystrom_lab.bench.approx.commands`), the
option helpers they share in :mod:`nystrom_lab.bench.options`.
"""

from __future__ import annotations

import argparse

from nystrom_lab.argtypes import (
    UsageError,
    add_device_option,
    cpu_only,
    positive_float,
    positive_int,
    positive_ints,
)
from nystrom_lab.attention_spec import attention
from nystrom_lab.bench.core.commands import CORE_ONLY, run_core_command
from nystrom_lab.bench.launches.commands import run_launches_command
from nystrom_lab.bench.malloc import MALLOC
from nystrom_lab.bench.models.commands import MODELS_ONLY, run_models_command
from nystrom_lab.bench.models.commands import add_options as add_models_options
from nystrom_lab.bench.options import BENCH_OUT, add_output_options, names
from nystrom_lab.bench.table1.commands import TABLE1_ONLY, run_table1_command
from nystrom_lab.bench.training.commands import TRAINING_ONLY, run_training_command

# options that belong to one suite only; naming one for another suite is an error, not ignored.
# what `bench training` does not take: its sizes are the paper's and TransMIL's regimes
_NOT_TRAINING = (*TABLE1_ONLY, "modes", "attention", "lengths", "heads", "dim_head")


def _cmd_bench(args: argparse.Namespace) -> int:
    wrong = {
        "table1": (*CORE_ONLY, *TRAINING_ONLY, *MODELS_ONLY),
        "core": (*TABLE1_ONLY, *TRAINING_ONLY, *MODELS_ONLY),
        "training": (*_NOT_TRAINING, *MODELS_ONLY),
        "models": (*(o for o in _NOT_TRAINING if o not in ("lengths", "device", "threads")), *TRAINING_ONLY),
        "launches": (*(o for o in _NOT_TRAINING if o != "lengths"), *TRAINING_ONLY, *MODELS_ONLY, "repeats"),
    }[args.suite]
    given = [f"--{o.replace('_', '-')}" for o in wrong if getattr(args, o) not in (None, False)]
    if args.suite == "training" and args.dtype != "float32":
        given.append("--dtype")
    if given:
        raise UsageError(f"nystrom bench {args.suite}: option(s) {given} do not apply to this suite")
    if args.suite in ("core", "training"):
        cpu_only(args, f"bench {args.suite}")  # they measure CPU kernels, allocators and threads
    if args.suite == "models":
        return run_models_command(args)
    if args.suite == "launches":
        return run_launches_command(args)
    markdown = None if args.no_markdown else args.out / "benchmarks.md"
    if args.suite == "core":
        return run_core_command(args, markdown)
    if args.suite == "training":
        return run_training_command(args, markdown)
    return run_table1_command(args, markdown)


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
    add_models_options(b)  # models: whole long-document encoders, ours vs transformers'
    r = b.add_argument_group("training only")
    r.add_argument(
        "--malloc",
        choices=tuple(MALLOC),  # bench.measure.MALLOC: the one list of modes
        help="the cases' C allocator: system (default: as set up; glibc maps blocks of ≥ 32 MiB fresh, "
        "so their first touch page-faults in every call) or cached (glibc keeps freed memory, as a "
        "caching allocator would); a cached run writes its own json, png and markdown section",
    )
    b.set_defaults(func=_cmd_bench)
