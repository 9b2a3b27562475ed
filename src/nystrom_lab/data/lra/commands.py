"""``nystrom data ...`` sub-commands: generate ListOps and Pathfinder locally (no downloads).

Wire with ``register(subparsers)`` from the top-level CLI; each leaf sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse

from nystrom_lab.argtypes import non_negative_int, output_dir, positive_int
from nystrom_lab.data.constants import DIFFICULTY_DIRS


def _run_listops(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from nystrom_lab.data.lra.listops import generate_listops

    total = args.train + args.dev + args.test
    with tqdm(total=total, desc="listops", unit="ex") as bar:
        paths = generate_listops(
            args.out_dir,
            train=args.train,
            dev=args.dev,
            test=args.test,
            seed=args.seed,
            workers=args.workers,
            chunk_size=args.chunk_size,
            progress=bar.update,
        )
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


def _run_pathfinder(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from nystrom_lab.data.lra.pathfinder_io import generate_pathfinder

    with tqdm(total=args.count, desc=f"pathfinder-{args.difficulty}", unit="img") as bar:
        root = generate_pathfinder(
            args.out_dir,
            difficulty=args.difficulty,
            count=args.count,
            seed=args.seed,
            images_per_batch=args.images_per_batch,
            workers=args.workers,
            progress=bar.update,
        )
    print(f"wrote {args.count} images under {root}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``data listops``, ``data pathfinder`` and ``data brown`` to a top-level ``add_subparsers()``."""
    from nystrom_lab.data.corpus_commands import register as register_corpora

    data = subparsers.add_parser("data", help="generate Long Range Arena data locally; prepare text corpora")
    sub = data.add_subparsers(dest="data_command", required=True)

    lo = sub.add_parser("listops", help="ListOps TSVs like the LRA release (basic_{train,val,test}.tsv)")
    lo.add_argument("out_dir", type=output_dir, metavar="OUT_DIR")
    lo.add_argument("--train", type=non_negative_int, default=96_000, help="train examples (default 96000)")
    lo.add_argument("--dev", type=non_negative_int, default=2_000, help="dev examples (default 2000)")
    lo.add_argument("--test", type=non_negative_int, default=2_000, help="test examples (default 2000)")
    lo.add_argument("--seed", type=int, default=0)
    lo.add_argument("--workers", type=positive_int, default=1, help="processes; output does not depend on it")
    lo.add_argument("--chunk-size", type=positive_int, default=500, help="examples per seeded chunk")
    lo.set_defaults(func=_run_listops)

    pf = sub.add_parser("pathfinder", help="Pathfinder 32x32 PNG folders + metadata like the LRA release")
    pf.add_argument("out_dir", type=output_dir, metavar="OUT_DIR")
    pf.add_argument("--difficulty", type=int, choices=sorted(DIFFICULTY_DIRS), default=14)
    pf.add_argument("--count", type=positive_int, default=1000, help="number of images (default 1000)")
    pf.add_argument("--seed", type=int, default=0)
    pf.add_argument("--workers", type=positive_int, default=1, help="processes; output does not depend on it")
    pf.add_argument(
        "--images-per-batch", type=positive_int, default=1000, help="images per imgs/<batch> folder"
    )
    pf.set_defaults(func=_run_pathfinder)

    register_corpora(sub)
