"""The ``nystrom finetune`` (your CSV/TSV/JSONL files, or GLUE / IMDB) and ``nystrom predict`` commands.

Wire with ``register(subparsers)`` from the top-level CLI; each leaf sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nystrom_lab.argtypes import (
    add_device_options,
    device_options,
    existing_dir,
    existing_file,
    output_file,
    positive_float,
    positive_int,
)
from nystrom_lab.text.options import add_common, input_file, is_main, run_folder

_FINETUNE_EPILOG = """\
your files: nystrom finetune --train-file train.csv --validation-file dev.csv --text-column text \\
                --label-column label --out runs/mine          (--init-from minilm, the default)
            nystrom predict runs/mine/model --input new.csv --output predictions.jsonl
GLUE/IMDB:  nystrom finetune sst2 --data glue_data --init-from minilm --out runs/sst2
start:      --init-from a BERT/RoBERTa folder or minilm, a folder of ours (e.g. a `nystrom pretrain` run or
            `nystrom convert long` output), a transformers Nystromformer folder, or a configuration (bert-small,
            bert-base, a config .json: a fresh random model)
rows:       one example per row, padded to the batch's longest: a sequence label (class, score) belongs to its
            row, so classification and regression do not pack documents (`nystrom pretrain` packs them)
"""


def cmd_finetune(args: argparse.Namespace) -> int:
    from nystrom_lab.text.finetune import FinetuneRun, run_finetune

    if args.out is None:
        args.out = (
            Path("runs") / "finetune" / (args.task or (args.train_file.stem if args.train_file else "run"))
        )
    run = FinetuneRun(
        task=args.task, data=args.data, train_file=args.train_file, validation_file=args.validation_file,
        test_file=args.test_file, text_column=args.text_column, text_pair_column=args.text_pair_column,
        label_column=args.label_column, problem_type=args.problem_type, out=args.out, preset=args.preset,
        init_from=args.init_from, tokenizer=args.tokenizer, attention=args.attention,
        batch_size=args.batch_size, lr=args.lr, epochs=args.epochs, max_length=args.max_length,
        max_train_examples=args.max_train_examples, max_eval_examples=args.max_eval_examples,
        dropout=args.dropout, seed=args.seed, metric=args.metric, **device_options(args),
    )  # fmt: skip
    with run_folder(args.out):
        res = run_finetune(run, progress=not args.no_progress)
    if is_main():
        for split, r in res.items():
            if split not in ("loop", "truncated"):
                shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(r.items()) if k != "examples")
                print(f"{run.task or 'finetune'} {split}: {shown} ({r['examples']} examples)")
        print(
            f"model (for `nystrom predict` and transformers) in {args.out / 'model'}; predictions in {args.out}"
        )
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from nystrom_lab.text.predict import run_predict

    run_predict(
        args.model_dir, args.input, output=args.output, text_column=args.text_column,
        text_pair_column=args.text_pair_column, batch_size=args.batch_size, device=args.device,
        precision=args.precision or "fp32", progress=not args.no_progress,
    )  # fmt: skip
    if args.output is not None:
        print(f"predictions in {args.output}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``finetune`` and ``predict`` to a top-level ``add_subparsers()``."""
    from nystrom_lab.data.constants import FINETUNE_TASKS
    from nystrom_lab.text.presets import FINETUNE_PRESETS as FT_PRESETS

    f = subparsers.add_parser(
        "finetune", help="fine-tune a classifier on your CSV/TSV/JSONL files, or GLUE / IMDB (the paper's Table 2)",
        epilog=_FINETUNE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    f.add_argument("task", nargs="?", choices=FINETUNE_TASKS, help="a GLUE task or imdb (with --data)")
    f.add_argument("--data", type=existing_dir, help="GLUE root (holding SST-2/, MRPC/, ...) or aclImdb/")
    f.add_argument("--train-file", type=existing_file, help="training table: .csv, .tsv or .jsonl")
    f.add_argument(
        "--validation-file", type=existing_file, help="dev table: selects the best step, is predicted"
    )
    f.add_argument("--test-file", type=existing_file, help="test table (labels optional): predicted once")
    f.add_argument("--text-column", default="text", help="column of the text (default text)")
    f.add_argument("--text-pair-column", help="column of the second text of a pair task")
    f.add_argument("--label-column", default="label", help="column of the labels (default label)")
    f.add_argument(
        "--problem-type", choices=("single_label_classification", "multi_label_classification", "regression"),
        help="default: lists -> multi-label, integers or names -> classes, other numbers -> regression",
    )  # fmt: skip
    f.add_argument("--preset", choices=sorted(FT_PRESETS), default="paper")
    f.add_argument("--epochs", type=positive_float, help="passes over the training set (paper: 4)")
    f.add_argument(
        "--max-length", type=positive_int,
        help="tokens per example (128; IMDB 512); examples are padded per batch, never packed (one label per row)",
    )  # fmt: skip
    f.add_argument("--max-train-examples", type=positive_int, help="use only the first N training examples")
    f.add_argument(
        "--max-eval-examples", type=positive_int, help="use only the first N of each dev/test split"
    )
    f.add_argument(
        "--metric", "--select-metric", dest="metric",
        choices=("accuracy", "f1", "macro_f1", "micro_f1", "matthews", "pearson", "spearman", "mse", "loss"),
        help="dev metric that picks the best weights (default: accuracy; multi-label macro_f1; regression"
        " pearson). f1 = F1 of class 1 of a two-class task (MRPC/QQP); matthews for CoLA-like data",
    )  # fmt: skip
    add_common(f, init_from="minilm", what="the model to fine-tune")  # --out: runs/finetune/<task or file>
    f.set_defaults(func=cmd_finetune)

    r = subparsers.add_parser(
        "predict", help="labels and scores for new text with a `nystrom finetune` model (JSON Lines)"
    )
    r.add_argument("model_dir", type=existing_dir, help="OUT/model of `nystrom finetune`")
    r.add_argument(
        "--input", required=True, type=input_file,
        help="CSV/TSV/JSONL table, a text file (one example per line) or - (stdin)",
    )  # fmt: skip
    r.add_argument("--output", type=output_file, help="JSON Lines to write (default: standard output)")
    r.add_argument("--text-column", default="text", help="column of the text in a table (default text)")
    r.add_argument("--text-pair-column", help="column of the second text of a pair task")
    r.add_argument("--batch-size", type=positive_int, default=32, help="examples per batch (default 32)")
    add_device_options(r, training=False)
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_predict)
