"""``nystrom pretrain long-positions``: the source, the step-0 screen, equal-budget training, the within-document
scoring and the report of the position-schemes experiment (:mod:`nystrom_lab.long_context.positions`), each
stage resumable.

The packed comparison (issue item 7) is one command (docs/long-context.md)::

    nystrom pretrain long-positions --corpus data/brown/brown.txt --out experiments/long-context/packed \\
        --variants copy-local-nystrom-packed window-512-continued copy-local-nystrom

It prints its plan (:func:`plan`), trains the source where its weights are missing, then each variant
unless finished (no screen: ``--variants`` names them), scores every trained model by position within the
document (stage ``within``) and writes the report; ``--plan-only`` prints the plan and stops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nystrom_lab.long_context.positions import PositionsRun

STAGES = ("source", "screen", "train", "within", "report", "genre")
#: what ``--stages all`` runs (genre needs --genres)
ALL = STAGES[:5]


def stages_of(requested: list[str], variants: tuple[str, ...]) -> tuple[str, ...]:
    """The stages ``--stages`` asks for, in the command's order; ``all``: :data:`ALL`, less the screen where
    ``variants`` are named (the screen only chooses them)."""
    if "all" in requested:
        return tuple(x for x in ALL if x != "screen" or not variants)
    return tuple(x for x in STAGES if x in requested)


def plan(run: PositionsRun, variants: tuple[str, ...]) -> list[dict]:
    """The runs the command trains, in order: the source (always first: every other run starts from it), then
    ``variants``; each with its layout, rows, steps, real tokens and whether it has finished."""
    from nystrom_lab.long_context.positions import SOURCE, finished
    from nystrom_lab.long_context.positions_budget import real_tokens

    out = []
    for name in (SOURCE, *(v for v in variants if v != SOURCE)):
        steps = run.variant_steps(name)
        length = run.length(name)
        out.append({
            "run": name, "layout": run.layout(name), "length": length, "batch_size": run.tokens_per_step // length,
            "steps": steps, "real_tokens": real_tokens(run, name, [steps])[0], "row_tokens": steps * run.tokens_per_step,
            "finished": finished(run, name, weights=name == SOURCE),
        })  # fmt: skip
    return out


def plan_lines(entries: list[dict]) -> list[str]:
    """The plan as the command prints it, one line per run."""
    return [
        f"{i}. {e['run']:<28} {e['layout']:<9} {e['batch_size']:>2} x {e['length']:<4} x {e['steps']:>3} steps:"
        f" {e['real_tokens'] / 1e6:.3f} M real tokens of {e['row_tokens'] / 1e6:.3f} M in rows"
        f"{' (finished)' if e['finished'] else ''}"
        for i, e in enumerate(entries, 1)
    ]


def cmd_long_positions(args) -> int:
    from nystrom_lab.argtypes import UsageError
    from nystrom_lab.long_context.experiment import experiment_packing
    from nystrom_lab.long_context.positions import (
        SOURCE,
        PositionsRun,
        chosen_variants,
        train_variant,
    )
    from nystrom_lab.long_context.positions_screen import screen

    try:
        packing = experiment_packing(args.packing, args.out)
        run = PositionsRun(corpus=tuple(args.corpus), out=args.out, steps=args.steps, source_steps=args.source_steps,
                           train_variants=tuple(args.variants or ()), seed=args.seed, packing=packing)  # fmt: skip
    except ValueError as err:
        raise UsageError(str(err)) from err
    if args.plan_only:
        from nystrom_lab.long_context.positions_screen import read_screen

        print("\n".join(plan_lines(plan(run, chosen_variants(run, read_screen(run))))))
        return 0
    run.write_settings()
    stages = stages_of(args.stages, run.train_variants)
    if "genre" in stages and args.genres is None:
        raise UsageError(
            "--stages genre needs --genres DIR (`nystrom data brown OUT --genres` writes OUT/genres)"
        )
    progress = not args.no_progress
    if "source" in stages:
        # weights=True: the later stages load the source (a fresh checkout has its results, not its weights)
        train_variant(run, SOURCE, weights=True, progress=progress, device=args.device)
    from nystrom_lab.long_context.positions_report import write_report

    step0 = screen(run, progress=progress) if "screen" in stages else None
    trained: tuple[str, ...] = run.train_variants
    if "train" in stages:
        from nystrom_lab.long_context.positions_screen import read_screen

        write_report(run, probes=False)  # the screen's table now, not only after hours of training
        trained = chosen_variants(run, step0 or read_screen(run))
        print(f"[{run.TAG}] plan ({run.out}):", *plan_lines(plan(run, trained)), sep="\n  ", flush=True)
        for variant in trained:
            train_variant(run, variant, progress=progress, device=args.device)
            write_report(run, probes=False)
    if "within" in stages:
        from nystrom_lab.long_context.positions_report import trained as trained_folders
        from nystrom_lab.long_context.positions_within import within_document

        within_document(run, (SOURCE, *trained) if trained else trained_folders(run), device=args.device,
                        progress=progress)  # fmt: skip
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
        " (step 0), train (equal budget), within (score every trained model by position within the document),"
        " report, genre (fine-tune the best long model and window-512-continued; not part of all). all: source,"
        " screen (unless --variants), train, within, report",
    )  # fmt: skip
    c.add_argument(
        "--variants", nargs="+", metavar="NAME", choices=positions.TRAINABLE,
        help="variants to train (default: window-512-continued, copy-nystrom and the two best screened"
        f" Nyström variants); names SCHEME-ATTENTION[{positions.PACKED}] with SCHEME in {list(positions.SCHEMES)}"
        f" and ATTENTION in {list(positions.ATTENTIONS)}: plain names train on the stream, {positions.PACKED}"
        " ones on packed documents until they have seen the stream runs' real tokens",
    )  # fmt: skip
    c.add_argument(
        "--packing", choices=("documents", "stream"),
        help="the layout of the long variants the experiment chooses itself (without --variants): documents"
        " (-packed names) or stream. Default: what OUT/settings.json records (a record without it: stream),"
        " else documents; another layout than the recorded one is refused",
    )  # fmt: skip
    c.add_argument(
        "--plan-only", action="store_true", help="print the runs the command would train (layout, steps, real"
        " tokens) and stop",
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
