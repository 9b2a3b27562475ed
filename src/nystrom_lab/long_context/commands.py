"""``nystrom pretrain long-context``: train (or resume) the long-context experiment's variants, then write
its report (:mod:`nystrom_lab.long_context.experiment`, :mod:`nystrom_lab.long_context.report`)."""

from __future__ import annotations

from nystrom_lab.argtypes import UsageError
from nystrom_lab.long_context.experiment import (
    ORDER,
    VARIANTS,
    LongContextRun,
    experiment_packing,
    train_variant,
)


def cmd_long_context(args) -> int:
    from nystrom_lab.long_context.report import write_report

    try:
        packing = experiment_packing(args.packing, args.out)
    except ValueError as err:
        raise UsageError(str(err)) from err
    run = LongContextRun(corpus=tuple(args.corpus), out=args.out, variants=tuple(args.variants), steps=args.steps,
                         seed=args.seed, packing=packing)  # fmt: skip
    run.write_settings()
    if not args.report_only:
        for variant in run.variants:
            train_variant(run, variant, progress=not args.no_progress, device=args.device)
    report = write_report(run, probes=not args.no_probes)
    for name, v in report["variants"].items():
        if v:
            print(f"{name:>13}: {v['steps']}/{v['target_steps']} steps, dev MLM accuracy {v['initial_mlm_acc']:.4f}"
                  f" -> {v['final_mlm_acc']:.4f}")  # fmt: skip
    print(f"results: {run.out / 'results.json'}, {run.out / 'results.md'}, {run.out / 'curves.png'}")
    if args.genres is not None:
        from nystrom_lab.long_context.genre import genre_report, train_genre

        seeds = tuple(args.genre_seeds)
        if not args.report_only:
            train_genre(run.out, args.genres, seeds=seeds, device=args.device)
        genre_report(run.out, args.genres, seeds=seeds)
        print((run.out / "genre" / "results.md").read_text())
    return 0


def register(sub) -> None:
    """``nystrom pretrain long-context`` under the ``pretrain`` command's sub-parsers."""
    import argparse

    from nystrom_lab.argtypes import add_device_option, existing_dir, output_dir, positive_int
    from nystrom_lab.long_context import experiment as long_context
    from nystrom_lab.text.layout import LAYOUTS
    from nystrom_lab.text.options import corpus

    d = LongContextRun(corpus=("unused",))
    c = sub.add_parser(
        "long-context", help="MiniLM made long: window-512 vs nystrom-4096 vs softmax-4096 (continued MLM)",
        description=long_context.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    c.add_argument("--corpus", type=corpus, nargs="+", required=True, help="e.g. data/brown/brown.txt")
    c.add_argument("--out", type=output_dir, default=d.out, help=f"experiment folder (default {d.out})")
    c.add_argument(
        "--variants", nargs="+", choices=list(VARIANTS), default=list(ORDER), help="default: all three"
    )
    c.add_argument("--steps", type=positive_int, default=d.steps, help=f"optimiser steps (default {d.steps})")
    c.add_argument("--seed", type=int, default=d.seed, help="head, example order, masks (default 0)")
    c.add_argument(
        "--packing", choices=LAYOUTS,
        help=f"every variant's rows (default {d.packing}, or what OUT/settings.json records): documents packs"
        " whole documents, each attending only to itself (a Brown document sits alone in a 4096-token row: 37 %% padding);"
        " stream reproduces the layout before packing (documents concatenated and cut into rows, seeing each"
        " other); off pads one document piece per row",
    )  # fmt: skip
    c.add_argument(
        "--genres", type=existing_dir, metavar="DIR",
        help="then fine-tune Brown genre classification on DIR's tables (`nystrom data brown OUT --genres`"
        " writes OUT/genres): whole documents with nystrom-4096 vs the first 512 tokens with window-512",
    )  # fmt: skip
    c.add_argument("--genre-seeds", type=int, nargs="+", default=[0], help="fine-tuning seeds (default 0)")
    add_device_option(c, help_="every child run's device: auto (CUDA when available, default), cpu or cuda")
    c.add_argument("--report-only", action="store_true", help="train nothing: rewrite results and figure")
    c.add_argument(
        "--no-probes", action="store_true", help="keep the step-time/memory probes already in results.json"
    )
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_long_context)
    from nystrom_lab.long_context.positions_commands import register as register_positions

    register_positions(sub)
