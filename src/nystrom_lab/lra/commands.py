"""The ``nystrom lra TASK`` command: the paper's LRA runs (Table 3) on the shared training loop.

Wire with ``register(subparsers)`` from the top-level CLI; the leaf sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse

from nystrom_lab.argtypes import (
    UsageError,
    add_device_options,
    device_options,
    existing_dir,
    output_dir,
    positive_float,
    positive_int,
)
from nystrom_lab.attention_spec import attention
from nystrom_lab.lra.presets import PRESET_NAMES, TASKS

_EPILOG = """\
attention specs: NAME[-M][,key=value,...], keys = the attention module's constructor options; a key
left unset takes the official LRA value (Nystrom: conv_kernel_size=35), else the constructor's default:
  nystrom                    Nystrom, NystromAttention's default landmarks (64) and pinv iterations
  nystrom-32,pinv=exact      Nystrom, 32 landmarks, exact pseudo-inverse
  softmax                    exact softmax attention (no number)
  linformer-256              Linformer, projection length 256
  performer-256              Performer, 256 random features
  reformer-2                 Reformer, 2 hashes
  longformer-257             Longformer sliding window of 257 tokens (odd)

data (--data DIR; ListOps without --data is generated into OUT/data):
  listops     basic_{train,val,test}.tsv        (lra_release/listops-1000)
  text        aclImdb/{train,test}/{neg,pos}/*.txt
  retrieval   new_aan_pairs.{train,eval,test}.tsv (lra_release/tsv_data)
  image       cifar-10-batches-py/{data_batch_1..5,test_batch}
  pathfinder  pathfinder32/ holding curv_contour_length_14/{imgs,metadata}

Re-running the same command resumes from OUT/last.
"""


def _sizes(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    try:
        vals = tuple(int(p) for p in parts)
    except ValueError:
        vals = ()
    if len(vals) != 3 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected TRAIN,DEV,TEST positive integers, got {text!r}")
    return vals  # type: ignore[return-value]


def run_from_args(args: argparse.Namespace):
    """The :class:`LRARun` an argparse namespace of this command describes."""
    from nystrom_lab.lra.experiment import LRARun

    return LRARun(
        task=args.task,
        attention=args.attention,
        preset=args.preset,
        data=args.data,
        out=args.out,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        max_length=args.max_length,
        eval_batches=args.eval_batches,
        eval_every=args.eval_every,
        seed=args.seed,
        **device_options(args),
        pool_padding=args.pool_padding,
        listops_sizes=args.listops_sizes,
    )


def cmd_lra(args: argparse.Namespace) -> int:
    """Run one LRA experiment; prints the test accuracy. Missing data files are a usage error."""
    from nystrom_lab.lra.experiment import MissingDataError, run_lra
    from nystrom_lab.training.runlock import hold_run_folder

    try:
        run = run_from_args(args)
    except ValueError as err:  # options that do not go together
        raise UsageError(str(err)) from err
    out = run.out_dir()
    try:
        with hold_run_folder(out):  # before the data: a second run into OUT refuses at once
            results = run_lra(run, progress=not args.no_progress)
    except MissingDataError as err:
        raise UsageError(str(err)) from err
    acc = results["test"]["accuracy"]
    best = results["best_dev"]
    best_txt = "n/a" if best is None else f"{best:.4f}"
    print(
        f"{args.task} [{args.attention}, preset {args.preset}, seed {args.seed}]: "
        f"test accuracy {acc:.4f} on {results['test_examples']} examples "
        f"(best dev {best_txt} at step {results['best_step']}); results in {out / 'results.json'}"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``lra`` to a top-level ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "lra",
        help="train and test the paper's LRA model on one task (Table 3)",
        description="Train and test the paper's LRA model on one task (Table 3) on the shared loop.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", choices=TASKS)
    p.add_argument(
        "--attention",
        type=attention,
        metavar="SPEC",
        default="nystrom",
        help="attention spec NAME[-M][,key=value,...] (default nystrom; see below)",
    )
    p.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default="official",
        help="official: the released per-task schedule; quick: a few minutes on a CPU (smoke test)",
    )
    p.add_argument("--data", type=existing_dir, help="folder with the task's files in the release format")
    p.add_argument("--out", type=output_dir, help="output folder (default runs/lra/TASK-ATTN-PRESET-seedS)")
    p.add_argument("--steps", type=positive_int, help="optimiser steps (warm-up scales proportionally)")
    p.add_argument("--batch-size", type=positive_int, help="examples per optimiser step")
    p.add_argument("--lr", type=positive_float, help="peak learning rate")
    p.add_argument(
        "--max-length", type=positive_int, help="tokens per sequence/document (text: 1000 = released script)"
    )
    p.add_argument(
        "--eval-batches", type=positive_int, help="bound each dev evaluation (test is always full)"
    )
    p.add_argument(
        "--eval-every", type=positive_int, help="steps between dev evaluations (default: the preset's)"
    )
    p.add_argument("--seed", type=int, default=0, help="initialisation and example order (default 0)")
    add_device_options(p)
    p.add_argument(
        "--pool-padding",
        action="store_true",
        help="mean-pool over padding too (zeros counted in the denominator), as the official code did",
    )
    p.add_argument(
        "--listops-sizes",
        type=_sizes,
        metavar="TRAIN,DEV,TEST",
        help="sizes of generated ListOps (default 96000,2000,2000; quick 4000,500,500)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_lra)
