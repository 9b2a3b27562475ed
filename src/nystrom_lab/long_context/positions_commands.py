"""``nystrom pretrain long-positions``: the source, the step-0 screen, equal-budget training and the report of
the position-schemes experiment (:mod:`nystrom_lab.long_context.positions`), each stage resumable."""

from __future__ import annotations

STAGES = ("source", "screen", "train", "report", "genre")


def cmd_long_positions(args) -> int:
    from nystrom_lab.long_context.positions import (
        SOURCE,
        PositionsRun,
        chosen_variants,
        train_variant,
    )
    from nystrom_lab.long_context.positions_screen import screen

    run = PositionsRun(corpus=tuple(args.corpus), out=args.out, steps=args.steps, source_steps=args.source_steps,
                       train_variants=tuple(args.variants or ()), seed=args.seed)  # fmt: skip
    run.write_settings()
    stages = STAGES[:4] if "all" in args.stages else args.stages
    if "genre" in stages and args.genres is None:
        from nystrom_lab.argtypes import UsageError

        raise UsageError(
            "--stages genre needs --genres DIR (`nystrom data brown OUT --genres` writes OUT/genres)"
        )
    progress = not args.no_progress
    if "source" in stages:
        # weights=True: the later stages load the source (a fresh checkout has its results, not its weights)
        train_variant(run, SOURCE, weights=True, progress=progress, device=args.device)
    from nystrom_lab.long_context.positions_report import write_report

    step0 = screen(run, progress=progress) if "screen" in stages else None
    if "train" in stages:
        from nystrom_lab.long_context.positions_screen import read_screen

        write_report(run, probes=False)  # the screen's table now, not only after hours of training
        for variant in chosen_variants(run, step0 or read_screen(run)):
            train_variant(run, variant, progress=progress, device=args.device)
            write_report(run, probes=False)
    if "report" in stages:
        write_report(run, probes=not args.no_probes)
        print((run.out / "results.md").read_text())
        print(f"results: {run.out / 'results.json'}, {run.out / 'results.md'}, {run.out / 'curves.png'}")
    if "genre" in stages:
        from nystrom_lab.long_context.positions_genre import run_genre

        genre = run_genre(
            run, args.genres, seeds=tuple(args.genre_seeds), epochs=args.genre_epochs, device=args.device
        )
        write_report(run, probes=False, genre=genre)
        print((run.out / "genre" / "results.md").read_text())
    return 0


def register(sub) -> None:
    """``nystrom pretrain long-positions`` under the ``pretrain`` command's sub-parsers."""
    import argparse

    from nystrom_lab.argtypes import add_device_option, existing_dir, output_dir, positive_int
    from nystrom_lab.long_context import positions
    from nystrom_lab.long_context.positions_genre import GENRE_EPOCHS, GENRE_SEEDS
    from nystrom_lab.text.options import corpus

    d = positions.PositionsRun(corpus=("unused",))
    c = sub.add_parser(
        "long-positions", help="long models as good as their 512-token source: position schemes, step-0 screen,"
        " equal-budget training",
        description=positions.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    c.add_argument("--corpus", type=corpus, nargs="+", required=True, help="e.g. data/brown/brown.txt")
    c.add_argument("--out", type=output_dir, default=d.out, help=f"experiment folder (default {d.out})")
    c.add_argument(
        "--stages", nargs="+", choices=(*STAGES, "all"), default=["all"],
        help="what to do, in this order: source (train it, or again where its weights are missing), screen"
        " (step 0), train (equal budget), report, genre (fine-tune the best long model and window-512-continued; not part of all)",
    )  # fmt: skip
    c.add_argument(
        "--variants", nargs="+", metavar="NAME", choices=positions.TRAINABLE,
        help="variants to train (default: window-512-continued, copy-nystrom and the two best screened"
        f" Nyström variants); names SCHEME-ATTENTION with SCHEME in {list(positions.SCHEMES)} and ATTENTION"
        f" in {list(positions.ATTENTIONS)}",
    )  # fmt: skip
    c.add_argument(
        "--genres", type=existing_dir, metavar="DIR",
        help="stage genre: Brown genre tables (`nystrom data brown OUT --genres` writes OUT/genres)",
    )  # fmt: skip
    c.add_argument(
        "--genre-seeds",
        type=int,
        nargs="+",
        default=list(GENRE_SEEDS),
        help="fine-tuning seeds (default 0 1 2)",
    )
    c.add_argument(
        "--genre-epochs",
        type=positive_int,
        default=GENRE_EPOCHS,
        help=f"fine-tuning epochs (default {GENRE_EPOCHS})",
    )
    c.add_argument(
        "--source-steps", type=positive_int, default=d.source_steps, help=f"(default {d.source_steps})"
    )
    c.add_argument(
        "--steps", type=positive_int, default=d.steps, help=f"steps per trained variant (default {d.steps})"
    )
    c.add_argument("--seed", type=int, default=d.seed, help="source head, masks, example order (default 0)")
    add_device_option(c, help_="every child run's device: auto (CUDA when available, default), cpu or cuda")
    c.add_argument(
        "--no-probes", action="store_true", help="keep the step-time/memory probes already measured"
    )
    c.add_argument("--no-progress", action="store_true", help="no progress bars")
    c.set_defaults(func=cmd_long_positions)
