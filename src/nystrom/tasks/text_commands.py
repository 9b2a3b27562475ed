"""The ``nystrom pretrain``, ``nystrom pretrain compare``, ``nystrom pretrain-compare`` and
``nystrom finetune TASK`` commands.

Wire with ``register(subparsers)`` from the top-level CLI; each leaf sets ``func(args) -> int``.
Re-running the same command resumes from OUT/last; torchrun runs them on several processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nystrom.argtypes import (
    ArgumentParser,
    UsageError,
    add_device_options,
    device_options,
    existing_dir,
    existing_file,
    non_negative_int,
    open_fraction,
    output_dir,
    output_file,
    positive_float,
    positive_int,
)

_PRETRAIN_EPILOG = """\
presets: paper (batch 256, length 512, 500k steps), quick (16, 128, 200 steps),
         fig5 (16, 256, 200 steps: Figure-6 style from MiniLM, see docs/pretraining.md)
corpus:  files (blank-line separated documents, or --doc-mode file), folders (their *.txt), or the
         built-in python-docstrings (the standard library's docstrings + pydoc topics of this Python)
example: nystrom pretrain --preset fig5 --init-from-bert minilm --attention nystrom-64 \\
             --corpus python-docstrings --out runs/fig5/nystrom-64
Figure 5 from scratch (every variant, same data and steps): nystrom pretrain compare --help
"""

_COMPARE_EPILOG = """\
Trains (or resumes) every variant from a random initialisation with the same tokenizer, examples, masks,
steps and optimiser, one after the other, then writes OUT/results.json and OUT/curves.png (+ curves.md).
Re-running the same command resumes an interrupted variant and skips finished ones.
example (docs/pretraining.md, "Figure 5 from scratch"):
  nystrom data brown data/brown --fetch
  nystrom pretrain compare --corpus data/brown/brown.txt --out experiments/fig5-scratch
"""


_FINETUNE_EPILOG = """\
your files: nystrom finetune --train-file train.csv --validation-file dev.csv --text-column text \\
                --label-column label --init-from-bert minilm --out runs/mine
            nystrom predict runs/mine/model --input new.csv --output predictions.jsonl
GLUE/IMDB:  nystrom finetune sst2 --data glue_data --init-from-bert minilm --out runs/sst2
"""


def _dropout(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1), got {text!r}") from err
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1), got {text!r}")
    return value


def _kernel(text: str) -> int | None:
    return None if text in ("0", "none") else positive_int(text)


def _attention(text: str) -> str:
    """``nystrom-<landmarks>``, ``softmax``, ``linear``, ``linformer-<k>`` or ``performer-<features>``,
    checked at parse time; kept as written (Linformer's sequence length is filled in later)."""
    from nystrom.tasks.text_models import parse_attention

    try:
        parse_attention(text, max_seq_len=1)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--attention ")) from err
    return text


def _folder(text: str) -> str:
    """A folder that exists, kept as a string (as the run records store it)."""
    return str(existing_dir(text))


def _bert(text: str) -> str:
    """``minilm`` (the bundled all-MiniLM-L6-v2) or a folder that exists."""
    return text if text == "minilm" else _folder(text)


def _model(text: str) -> str:
    """A model preset name (bert-small, bert-base) or a configuration .json that exists."""
    if text.endswith(".json"):
        return str(existing_file(text))
    from nystrom.model import NystromformerConfig

    try:
        NystromformerConfig.preset(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a preset name or a config .json: {err}") from err
    return text


def _corpus(text: str) -> str:
    """A text file, a folder or a built-in corpus name."""
    from nystrom.data.text_corpus import BUILTIN_CORPORA

    if text in BUILTIN_CORPORA or Path(text).exists():
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} does not exist (nor is it one of {', '.join(BUILTIN_CORPORA)})"
    )


def _input(text: str) -> str:
    """``-`` (standard input) or a file that exists."""
    return text if text == "-" else str(existing_file(text))


def _run_folder(out: Path):
    from nystrom.training.runlock import hold_run_folder

    return hold_run_folder(out)  # before the data: a second run into OUT refuses at once


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from nystrom.tasks.pretrain import PretrainRun, run_pretrain

    missing = [flag for flag, v in (("--corpus", args.corpus), ("--out", args.out)) if not v]
    if missing:
        raise UsageError(f"{' and '.join(missing)} required (or: nystrom pretrain compare ...)")

    run = PretrainRun(
        corpus=tuple(args.corpus), out=args.out, preset=args.preset, tokenizer=args.tokenizer,
        train_tokenizer=args.train_tokenizer, init_from_bert=args.init_from_bert, model=args.model,
        attention=args.attention, conv_kernel=args.conv_kernel, steps=args.steps, batch_size=args.batch_size,
        seq_len=args.seq_len, lr=args.lr, warmup=args.warmup, eval_every=args.eval_every,
        eval_batches=args.eval_batches, dropout=args.dropout, doc_mode=args.doc_mode,
        dev_fraction=args.dev_fraction, grad_accum=args.grad_accum, seed=args.seed,
        **device_options(args),
    )  # fmt: skip
    with _run_folder(args.out):
        res = run_pretrain(run, progress=not args.no_progress)
    if _is_main():
        print(json.dumps(res, indent=2, sort_keys=True))
        print(f"model (best dev MLM accuracy) in {args.out / 'model'}")
    return 0


def cmd_pretrain_compare(args: argparse.Namespace) -> int:
    from nystrom.tasks.pretrain_compare import CompareRun, run_compare

    run = CompareRun(
        corpus=tuple(args.corpus), out=args.out, variants=tuple(args.variants), tokenizer=args.tokenizer,
        hidden_size=args.hidden, num_heads=args.heads, intermediate_size=args.ffn, num_layers=args.layers,
        seq_len=args.seq_len, batch_size=args.batch_size, steps=args.steps, lr=args.lr, warmup=args.warmup,
        eval_every=args.eval_every, eval_batches=args.eval_batches, conv_kernel=args.conv_kernel,
        dropout=args.dropout, seed=args.seed, **device_options(args),
    )  # fmt: skip
    with _run_folder(args.out):  # one compare per experiment folder; its variants run one after the other
        report = run_compare(run, progress=not args.no_progress, report_only=args.report_only)
    for variant, r in report["variants"].items():
        acc = (
            f"MLM final {r['final_mlm_accuracy']:.4f} best {r['best_mlm_accuracy']:.4f}, SOP {r['final_sop_accuracy']:.4f}"
            if "final_mlm_accuracy" in r
            else "no dev evaluation yet"
        )
        print(f"{variant:>15}: {r['steps']}/{r['target_steps']} steps, {acc}, {r['wall_time_s']:.0f} s")
    print(f"results: {args.out / 'results.json'}, curves: {args.out / 'curves.png'}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from nystrom.tasks.pretrain_compare import compare_runs

    print(compare_runs(args.runs, args.png, args.table), end="")
    print(f"figure: {args.png}" + (f", table: {args.table}" if args.table else ""))
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    from nystrom.tasks.finetune import FinetuneRun, run_finetune

    if args.out is None:
        args.out = Path("runs") / "finetune" / (args.task or (args.train_file.stem if args.train_file else "run"))
    run = FinetuneRun(
        task=args.task, data=args.data, train_file=args.train_file, validation_file=args.validation_file,
        test_file=args.test_file, text_column=args.text_column, text_pair_column=args.text_pair_column,
        label_column=args.label_column, problem_type=args.problem_type, out=args.out, preset=args.preset,
        init_from_bert=args.init_from_bert, from_hf=args.from_hf, from_pretrain=args.from_pretrain,
        model=args.model, tokenizer=args.tokenizer, attention=args.attention, conv_kernel=args.conv_kernel,
        batch_size=args.batch_size, lr=args.lr, epochs=args.epochs, max_length=args.max_length,
        max_train_examples=args.max_train_examples, max_eval_examples=args.max_eval_examples,
        dropout=args.dropout, seed=args.seed, metric=args.metric, **device_options(args),
    )  # fmt: skip
    with _run_folder(args.out):
        res = run_finetune(run, progress=not args.no_progress)
    if _is_main():
        for split, r in res.items():
            if split != "loop":
                shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(r.items()) if k != "examples")
                print(f"{run.task or 'finetune'} {split}: {shown} ({r['examples']} examples)")
        print(f"model (for `nystrom predict` and transformers) in {args.out / 'model'}; predictions in {args.out}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from nystrom.tasks.predict import run_predict

    run_predict(
        args.model_dir, args.input, output=args.output, text_column=args.text_column,
        text_pair_column=args.text_pair_column, batch_size=args.batch_size, device=args.device,
        precision=args.precision or "fp32", progress=not args.no_progress,
    )  # fmt: skip
    if args.output is not None:
        print(f"predictions in {args.output}", file=sys.stderr)
    return 0


def _common(p: argparse.ArgumentParser, *, out_required: bool = True) -> None:
    p.add_argument(
        "--out",
        type=output_dir,
        required=out_required,
        help="output folder (re-running resumes from OUT/last)",
    )
    p.add_argument(
        "--init-from-bert", type=_bert, metavar="PATH",
        help="HF BERT folder, or 'minilm' (bundled all-MiniLM-L6-v2)",
    )  # fmt: skip
    p.add_argument(
        "--tokenizer", type=existing_file, help="tokenizer.json (default: the one beside the initialisation)"
    )
    p.add_argument(
        "--conv-kernel", type=_kernel, default=65, help="Nyström conv skip taps (0 = none; default 65)"
    )
    p.add_argument("--batch-size", type=positive_int, help="examples per optimiser step (all processes)")
    p.add_argument("--lr", type=positive_float, help="peak learning rate")
    p.add_argument("--dropout", type=_dropout, help="override the model's dropout (0 for exact comparisons)")
    p.add_argument("--seed", type=int, default=0, help="initialisation, example order, masks (default 0)")
    add_device_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _register_compare(sub: argparse._SubParsersAction) -> None:
    from nystrom.tasks.pretrain_compare import FIG5_VARIANTS, CompareRun

    d = CompareRun(corpus=("unused",))
    c = sub.add_parser(
        "compare", help="Figure 5 from scratch: every attention variant, same data and steps",
        epilog=_COMPARE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    c.add_argument(
        "--corpus", type=_corpus, nargs="+", required=True, help="text files/folders, e.g. data/brown/brown.txt"
    )  # fmt: skip
    c.add_argument("--out", type=output_dir, default=d.out, help=f"experiment folder (default {d.out})")
    c.add_argument(
        "--variants", type=_attention, nargs="+", default=list(FIG5_VARIANTS),
        help=f"attention specs (default {' '.join(FIG5_VARIANTS)}; performer-256 optional)",
    )  # fmt: skip
    c.add_argument(
        "--tokenizer", type=existing_file, help="tokenizer.json (default: MiniLM's BERT-uncased WordPiece)"
    )
    for flag, field, what in (
        ("--hidden", "hidden_size", "width"), ("--heads", "num_heads", "heads"),
        ("--ffn", "intermediate_size", "FFN width"), ("--layers", "num_layers", "layers"),
        ("--seq-len", "seq_len", "tokens per example"), ("--batch-size", "batch_size", "examples per step"),
        ("--steps", "steps", "optimiser steps"), ("--eval-every", "eval_every", "steps between dev evaluations"),
        ("--eval-batches", "eval_batches", "dev batches per evaluation"),
    ):  # fmt: skip
        default = getattr(d, field)
        c.add_argument(flag, type=positive_int, default=default, help=f"{what} (default {default})")
    c.add_argument("--lr", type=positive_float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    c.add_argument(
        "--warmup", type=non_negative_int, help="warm-up steps (default 2%% of --steps, the paper's fraction)"
    )
    c.add_argument(
        "--conv-kernel", type=_kernel, default=d.conv_kernel, help="Nyström conv skip taps (0 = none; default 65)"
    )  # fmt: skip
    c.add_argument("--dropout", type=_dropout, help="override the model's dropout (default 0.1)")
    c.add_argument("--seed", type=int, default=0, help="initialisation, example order, masks (default 0)")
    add_device_options(c)
    c.add_argument(
        "--report-only", action="store_true", help="train nothing: rewrite results.json and curves"
    )
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_pretrain_compare)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``pretrain``, ``pretrain-compare`` and ``finetune`` to a top-level ``add_subparsers()``."""
    from nystrom.data.glue import FINETUNE_TASKS
    from nystrom.tasks.finetune import PRESETS as FT_PRESETS
    from nystrom.tasks.pretrain import PRESETS as PT_PRESETS

    p = subparsers.add_parser(
        "pretrain", help="masked-LM + sentence-order pre-training (the paper's Fig. 5/6)",
        epilog=_PRETRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--corpus", type=_corpus, nargs="+", help="text files, folders or 'python-docstrings' (required)"
    )
    p.add_argument("--preset", choices=sorted(PT_PRESETS), default="quick")
    p.add_argument(
        "--attention", type=_attention, default="nystrom-64",
        help="nystrom-<landmarks>, softmax, linear, linformer-<k> or performer-<features> (default nystrom-64)",
    )  # fmt: skip
    p.add_argument(
        "--model",
        type=_model,
        default="bert-small",
        help="fresh model: bert-small, bert-base or a config .json",
    )
    p.add_argument(
        "--train-tokenizer", type=positive_int, metavar="VOCAB", help="train a WordPiece on the corpus"
    )
    p.add_argument("--steps", type=positive_int, help="optimiser steps (warm-up = 2%% unless --warmup)")
    p.add_argument("--seq-len", type=positive_int, help="tokens per example")
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
    _common(p, out_required=False)  # not required here, so that `nystrom pretrain compare` parses
    p.set_defaults(func=cmd_pretrain)
    _register_compare(p.add_subparsers(dest="pretrain_command", metavar="{compare}", required=False))

    c = subparsers.add_parser(
        "pretrain-compare", help="dev MLM/SOP curves of pretrain runs in one PNG + table"
    )
    c.add_argument("runs", nargs="+", type=existing_dir, help="`nystrom pretrain` output folders")
    c.add_argument("--png", type=output_file, required=True, help="figure to write")
    c.add_argument("--table", type=output_file, help="markdown table to write")
    c.set_defaults(func=cmd_compare)

    f = subparsers.add_parser(
        "finetune", help="fine-tune a classifier on your CSV/TSV/JSONL files, or GLUE / IMDB (the paper's Table 2)",
        epilog=_FINETUNE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    f.add_argument("task", nargs="?", choices=FINETUNE_TASKS, help="a GLUE task or imdb (with --data)")
    f.add_argument("--data", type=existing_dir, help="GLUE root (holding SST-2/, MRPC/, ...) or aclImdb/")
    f.add_argument("--train-file", type=existing_file, help="training table: .csv, .tsv or .jsonl")
    f.add_argument("--validation-file", type=existing_file, help="dev table: selects the best step, is predicted")
    f.add_argument("--test-file", type=existing_file, help="test table (labels optional): predicted once")
    f.add_argument("--text-column", default="text", help="column of the text (default text)")
    f.add_argument("--text-pair-column", help="column of the second text of a pair task")
    f.add_argument("--label-column", default="label", help="column of the labels (default label)")
    f.add_argument(
        "--problem-type", choices=("single_label_classification", "multi_label_classification", "regression"),
        help="default: lists -> multi-label, integers or names -> classes, other numbers -> regression",
    )  # fmt: skip
    f.add_argument("--preset", choices=sorted(FT_PRESETS), default="paper")
    f.add_argument("--from-hf", type=_folder, metavar="PATH", help="HF Nystromformer folder")
    f.add_argument("--from-pretrain", type=_folder, metavar="DIR", help="output folder of `nystrom pretrain`")
    f.add_argument(
        "--model",
        type=_model,
        help="fresh model (no initialisation): bert-small, bert-base or a config .json",
    )
    f.add_argument(
        "--attention", type=_attention, help="nystrom-<landmarks> or softmax (default: the initialisation's)"
    )
    f.add_argument("--epochs", type=positive_float, help="passes over the training set (paper: 4)")
    f.add_argument("--max-length", type=positive_int, help="tokens per example (128; IMDB 512)")
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
    _common(f, out_required=False)  # default runs/finetune/<task or training file name>
    f.set_defaults(func=cmd_finetune)

    r = subparsers.add_parser(
        "predict", help="labels and scores for new text with a `nystrom finetune` model (JSON Lines)"
    )
    r.add_argument("model_dir", type=existing_dir, help="OUT/model of `nystrom finetune`")
    r.add_argument(
        "--input", required=True, type=_input,
        help="CSV/TSV/JSONL table, a text file (one example per line) or - (stdin)",
    )  # fmt: skip
    r.add_argument("--output", type=output_file, help="JSON Lines to write (default: standard output)")
    r.add_argument("--text-column", default="text", help="column of the text in a table (default text)")
    r.add_argument("--text-pair-column", help="column of the second text of a pair task")
    r.add_argument("--batch-size", type=positive_int, default=32, help="examples per batch (default 32)")
    add_device_options(r, training=False)
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_predict)

    from nystrom.tasks.convert_commands import register as register_convert

    register_convert(subparsers)  # `nystrom convert ...`: folders for transformers


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m nystrom.tasks.text_commands pretrain ...``, e.g. under torchrun)."""
    parser = ArgumentParser(prog="nystrom")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = int(args.func(args) or 0)
    from nystrom.training.loop import shutdown_distributed

    shutdown_distributed()  # under torchrun: leave the process group before exit (see its docstring)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
