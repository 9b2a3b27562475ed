"""The ``nystrom pretrain``, ``nystrom pretrain figure5`` (runs the Figure 5 experiment) and ``nystrom
plot-runs`` (draws the dev curves of existing runs) commands.

Wire with ``register(subparsers)`` from the top-level CLI; each leaf sets ``func(args) -> int``.
Re-running the same command resumes from OUT/last; torchrun runs them on several processes.
"""

from __future__ import annotations

import argparse
import json

from nystrom_lab.argtypes import (
    UsageError,
    add_device_options,
    device_options,
    existing_dir,
    existing_file,
    lr_scale_pair,
    non_negative_int,
    open_fraction,
    output_dir,
    output_file,
    positive_float,
    positive_int,
)
from nystrom_lab.attention_spec import attention
from nystrom_lab.text.layout import LAYOUTS
from nystrom_lab.text.options import add_common, corpus, dropout, is_main, run_folder

_PRETRAIN_EPILOG = """\
presets: paper (batch 256, length 512, 500k steps), quick (16, 128, 200 steps),
         fig5 (16, 256, 200 steps: Figure-6 style from MiniLM, see docs/pretraining.md)
corpus:  files (blank-line separated documents, or --doc-mode file), folders (their *.txt), or the
         built-in python-docstrings (the standard library's docstrings + pydoc topics of this Python)
start:   --init-from a configuration (bert-small, the default; bert-base; a config .json) trains from a
         random initialisation; a BERT folder or minilm is the paper's "from standard"; a folder of ours
         (e.g. from `nystrom convert long`) continues its pre-training (objective mlm by default)
example: nystrom pretrain --preset fig5 --init-from minilm --attention nystrom-64 \\
             --corpus python-docstrings --out runs/fig5/nystrom-64
Figure 5 from scratch (every variant, same data and steps): nystrom pretrain figure5 --help
dev curves of finished runs in one figure: nystrom plot-runs RUN... --png FIG.png
"""

_FIGURE5_EPILOG = """\
Trains (or resumes) every variant from a random initialisation with the same tokenizer, examples, masks,
steps and optimiser, one after the other, then writes OUT/results.json and OUT/curves.png (+ curves.md).
Re-running the same command resumes an interrupted variant and skips finished ones.
example (docs/pretraining.md, "Figure 5 from scratch"):
  nystrom data brown data/brown --fetch
  nystrom pretrain figure5 --corpus data/brown/brown.txt --out experiments/fig5-scratch
"""


def cmd_pretrain(args: argparse.Namespace) -> int:
    missing = [flag for flag, v in (("--corpus", args.corpus), ("--out", args.out)) if not v]
    if missing:
        raise UsageError(f"{' and '.join(missing)} required (or: nystrom pretrain figure5 ...)")
    from nystrom_lab.start_point import detect
    from nystrom_lab.text.pretrain import PretrainRun, run_pretrain

    continued = detect(args.init_from).kind == "nystrom"  # a folder of ours: continue its masked LM
    run = PretrainRun(
        corpus=tuple(args.corpus), out=args.out, preset=args.preset, tokenizer=args.tokenizer,
        train_tokenizer=args.train_tokenizer, init_from=args.init_from, attention=args.attention,
        objective=args.objective or ("mlm" if continued else "mlm+sop"), reference_length=args.reference_length,
        gradient_checkpointing=args.gradient_checkpointing, eval_at_start=args.eval_at_start,
        steps=args.steps, batch_size=args.batch_size, max_length=args.max_length, lr=args.lr,
        warmup=args.warmup, eval_every=args.eval_every, eval_batches=args.eval_batches, dropout=args.dropout, doc_mode=args.doc_mode,
        dev_fraction=args.dev_fraction, grad_accum=args.grad_accum, seed=args.seed, lr_scale=tuple(args.lr_scale),
        dev_seed=args.dev_seed, packing=args.packing,
        **_given(dupe_factor=args.dupe_factor), **device_options(args),
    )  # fmt: skip
    with run_folder(args.out):
        res = run_pretrain(run, progress=not args.no_progress)
    if is_main():
        print(json.dumps(res, indent=2, sort_keys=True))
        print(f"model (best dev MLM accuracy) in {args.out / 'model'}")
    return 0


_DUPE_HELP = "draws of masks and segment order per training pair (default 10, BERT's dupe_factor)"


def _given(**options: object) -> dict[str, object]:
    """The options the user gave (not None): the run's dataclass defaults hold for the others."""
    return {k: v for k, v in options.items() if v is not None}


def cmd_figure5(args: argparse.Namespace) -> int:
    from nystrom_lab.text.figure5 import Figure5Run, run_figure5

    run = Figure5Run(
        corpus=tuple(args.corpus), out=args.out, variants=tuple(args.variants), tokenizer=args.tokenizer,
        hidden_size=args.hidden, num_heads=args.heads, intermediate_size=args.ffn, num_layers=args.layers,
        max_length=args.max_length, batch_size=args.batch_size, steps=args.steps, lr=args.lr,
        warmup=args.warmup, eval_every=args.eval_every, eval_batches=args.eval_batches, dropout=args.dropout,
        seed=args.seed, **_given(dupe_factor=args.dupe_factor), **device_options(args),
    )  # fmt: skip
    with run_folder(args.out):  # one experiment per folder; its variants run one after the other
        report = run_figure5(run, progress=not args.no_progress, report_only=args.report_only)
    for variant, r in report["variants"].items():
        acc = (
            f"MLM final {r['final_mlm_accuracy']:.4f} best {r['best_mlm_accuracy']:.4f}, SOP {r['final_sop_accuracy']:.4f}"
            if "final_mlm_accuracy" in r
            else "no dev evaluation yet"
        )
        print(f"{variant:>15}: {r['steps']}/{r['target_steps']} steps, {acc}, {r['wall_time_s']:.0f} s")
    print(f"results: {args.out / 'results.json'}, curves: {args.out / 'curves.png'}")
    return 0


def cmd_plot_runs(args: argparse.Namespace) -> int:
    from nystrom_lab.text.figure5 import plot_runs

    print(plot_runs(args.runs, args.png, args.table), end="")
    print(f"figure: {args.png}" + (f", table: {args.table}" if args.table else ""))
    return 0


def _register_figure5(sub: argparse._SubParsersAction) -> None:
    from nystrom_lab.text.figure5 import FIG5_VARIANTS, Figure5Run

    d = Figure5Run(corpus=("unused",))
    c = sub.add_parser(
        "figure5", help="run the Figure 5 experiment: every attention variant from scratch, same data and steps",
        epilog=_FIGURE5_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    c.add_argument(
        "--corpus", type=corpus, nargs="+", required=True, help="text files/folders, e.g. data/brown/brown.txt"
    )  # fmt: skip
    c.add_argument("--out", type=output_dir, default=d.out, help=f"experiment folder (default {d.out})")
    c.add_argument(
        "--variants", type=attention, nargs="+", default=list(FIG5_VARIANTS),
        help=f"attention specs NAME[-M][,key=value,...] (default {' '.join(FIG5_VARIANTS)}; performer optional);"
        " each runs in OUT/<spec with its main option resolved>, e.g. OUT/nystrom-64",
    )  # fmt: skip
    c.add_argument(
        "--tokenizer", type=existing_file, help="tokenizer.json (default: MiniLM's BERT-uncased WordPiece)"
    )
    for flag, field, what in (
        ("--hidden", "hidden_size", "width"), ("--heads", "num_heads", "heads"),
        ("--ffn", "intermediate_size", "FFN width"), ("--layers", "num_layers", "layers"),
        ("--max-length", "max_length", "tokens per example"), ("--batch-size", "batch_size", "examples per step"),
        ("--steps", "steps", "optimiser steps"), ("--eval-every", "eval_every", "steps between dev evaluations"),
        ("--eval-batches", "eval_batches", "dev batches per evaluation"),
    ):  # fmt: skip
        default = getattr(d, field)
        c.add_argument(flag, type=positive_int, default=default, help=f"{what} (default {default})")
    c.add_argument("--lr", type=positive_float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    c.add_argument(
        "--warmup", type=non_negative_int,
        help="warm-up steps (default 2%% of --steps: BERT-base's 10k of 0.5M; BERT-small's 10k of 0.1M is 10%%)",
    )  # fmt: skip
    c.add_argument("--dropout", type=dropout, help="override the model's dropout (default 0.1)")
    c.add_argument("--dupe-factor", type=positive_int, help=_DUPE_HELP)
    c.add_argument("--seed", type=int, default=0, help="initialisation, example order, masks (default 0)")
    add_device_options(c)
    c.add_argument(
        "--report-only", action="store_true", help="train nothing: rewrite results.json and curves"
    )
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_figure5)


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add ``pretrain`` (with ``pretrain figure5``) and ``plot-runs`` to a top-level ``add_subparsers()``; returns
    the ``pretrain`` experiments' sub-parsers (the CLI adds ``long-context`` there)."""
    from nystrom_lab.text.presets import PRETRAIN_PRESETS as PT_PRESETS

    p = subparsers.add_parser(
        "pretrain", help="masked-LM + sentence-order pre-training (the paper's Fig. 5/6)",
        epilog=_PRETRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--corpus", type=corpus, nargs="+", help="text files, folders or 'python-docstrings' (required)"
    )
    p.add_argument("--preset", choices=sorted(PT_PRESETS), default="quick")
    p.add_argument(
        "--objective", choices=("mlm+sop", "mlm"),
        help="mlm+sop (the paper; the default) or mlm: whole documents in --max-length rows (--packing), MLM"
        " only (the default when --init-from is a folder of ours: continued pre-training)",
    )  # fmt: skip
    p.add_argument(
        "--packing", choices=LAYOUTS,
        help="how examples sit in --max-length rows. documents (the default wherever the model can keep packed"
        " documents apart: Nyström and softmax attention): packed end to end with no padding but a row's"
        " tail, each attending only to itself (mlm: whole documents, one longer than a row cut into pieces"
        " that are documents of their own; mlm+sop: the sentence pairs, SOP scored per pair). stream (mlm"
        " only; its fallback): the documents' concatenation cut into rows, a row's documents seeing each"
        " other (the long-context experiment's layout before packing). off (mlm+sop's fallback): one"
        " example per row, padded. A resumed run keeps its recorded layout",
    )  # fmt: skip
    p.add_argument(
        "--reference-length", type=positive_int, metavar="R",
        help="mlm: score dev tokens per position bucket of R-token pieces (default --max-length); a 512-token"
        " run with R=4096 is scored on the same tokens and buckets as a 4096-token one",
    )  # fmt: skip
    p.add_argument(
        "--gradient-checkpointing", action="store_true", help="recompute activations in the backward"
    )
    p.add_argument("--eval-at-start", action="store_true", help="also evaluate the initial weights (step 0)")
    p.add_argument(
        "--train-tokenizer", type=positive_int, metavar="VOCAB", help="train a WordPiece on the corpus"
    )
    p.add_argument("--steps", type=positive_int, help="optimiser steps (warm-up = 2%% unless --warmup)")
    p.add_argument("--max-length", type=positive_int, help="tokens per example (default: the preset's)")
    p.add_argument("--warmup", type=non_negative_int, help="warm-up steps")
    p.add_argument("--eval-every", type=positive_int, help="steps between dev evaluations")
    p.add_argument("--eval-batches", type=positive_int, help="dev batches per evaluation")
    p.add_argument(
        "--doc-mode",
        choices=("blank", "file"),
        default="blank",
        help="documents: blank-line separated or one per file",
    )
    p.add_argument(
        "--dev-fraction", type=open_fraction, default=0.05, help="documents held out for MLM/SOP accuracy"
    )
    p.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per step")
    p.add_argument(
        "--dev-seed", type=int, metavar="SEED",
        help="mlm: seed of the dev set's fixed masks (default --seed): runs with other --seed values (a"
        " continued run, so that it does not replay its source's batches) are scored on the same masked tokens",
    )  # fmt: skip
    p.add_argument(
        "--lr-scale", type=lr_scale_pair, nargs="+", default=[], metavar="GLOB=FACTOR",
        help="train the parameters whose names match GLOB at FACTOR x --lr, e.g. '*lm_head*=10'"
        " '*position_embeddings*=10' (new parameters faster than a pretrained body; first match wins)",
    )  # fmt: skip
    p.add_argument("--dupe-factor", type=positive_int, help=_DUPE_HELP)
    # --out is checked by the command, not required by the parser, so that `nystrom pretrain figure5` parses
    add_common(p, init_from="bert-small", what="the model to pre-train")
    p.set_defaults(func=cmd_pretrain)
    experiments = p.add_subparsers(dest="pretrain_command", metavar="{figure5,long-context}", required=False)
    _register_figure5(experiments)

    c = subparsers.add_parser(
        "plot-runs", help="plot the dev MLM/SOP curves of existing `nystrom pretrain` runs in one PNG + table"
    )
    c.add_argument("runs", nargs="+", type=existing_dir, help="`nystrom pretrain` output folders")
    c.add_argument("--png", type=output_file, required=True, help="figure to write")
    c.add_argument("--table", type=output_file, help="markdown table to write")
    c.set_defaults(func=cmd_plot_runs)
    return experiments  # the CLI adds `long-context` here (that experiment builds on this one)
