"""``nystrom convert``: write transformers folders (model + tokenizer) from BERT, transformers'
Nystromformer and old nystrom checkpoints, transformers Nystromformer folders from ours, and long-context
models from short pretrained ones (``convert long``, Longformer's recipe: :func:`nystrom.model.to_long`).

Every folder written holds a tokenizer when the source has one (``tokenizer.json``) or ``--tokenizer``
names one, so ``AutoTokenizer`` and ``pipeline(..., model=OUT)`` work on it; otherwise a note says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nystrom_lab.argtypes import UsageError, existing_dir, existing_file, output_dir, positive_int


def _tokenizer(args: argparse.Namespace) -> Path | None:
    if args.tokenizer is not None:
        return Path(args.tokenizer)  # checked by argparse (existing_file)
    beside = Path(args.source) / "tokenizer.json"
    return beside if beside.is_file() else None


def _write(model, args: argparse.Namespace, write) -> int:
    from nystrom.model import save_tokenizer

    tok = _tokenizer(args)
    write(model, args.out)
    if tok is None:
        print(f"[nystrom] note: {args.source} has no tokenizer.json; {args.out} has no tokenizer"
              " (give --tokenizer tokenizer.json)", file=sys.stderr)  # fmt: skip
    else:
        save_tokenizer(tok, args.out, model_max_length=model.config.max_position_embeddings)
    print(f"wrote {type(model).__name__} to {args.out}")
    return 0


def save_long_tokenizer(source: Path, out: Path, *, max_length: int, tokenizer: Path | None) -> bool:
    """The source's tokenizer in ``out`` with ``model_max_length = max_length``: ``tokenizer`` or the source's
    ``tokenizer.json``, else whatever ``AutoTokenizer`` reads in the folder (RoBERTa's vocab.json + merges.txt).
    False when the source has none."""
    from nystrom.model import save_tokenizer

    tok = tokenizer or (source / "tokenizer.json")
    if tok.is_file():
        save_tokenizer(tok, out, model_max_length=max_length)
        return True
    from transformers import AutoTokenizer

    try:
        auto = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    except (OSError, ValueError, TypeError):
        return False
    auto.model_max_length = max_length
    auto.save_pretrained(str(out))
    return True


def cmd_convert_long(args: argparse.Namespace) -> int:
    from nystrom.model import source_length, to_long

    if args.num_landmarks is not None and args.attention != "nystrom":
        raise UsageError("--num-landmarks applies to --attention nystrom")
    _, length = source_length(args.source)  # config.json checks before any weight is read
    if args.max_length <= length:
        raise UsageError(f"--max-length {args.max_length} must be above the source's {length} positions")
    attention: dict = {"name": "softmax"}
    if args.attention == "nystrom":
        attention = {"name": "nystrom", "num_landmarks": args.num_landmarks or 64, "conv_kernel_size": args.conv_kernel}
    model = to_long(args.source, max_position_embeddings=args.max_length, attention=attention, seed=args.seed)
    model.save_pretrained(args.out)
    if not save_long_tokenizer(Path(args.source), args.out, max_length=args.max_length, tokenizer=args.tokenizer):
        print(f"[nystrom] note: {args.source} has no tokenizer; {args.out} has none (give --tokenizer)", file=sys.stderr)
    pos = model.nystromformer.embeddings
    print(f"wrote {type(model).__name__} ({args.attention}, {args.max_length} positions: the source's {length}"
          f" rows copied {args.max_length / length:.1f}x, offset {pos.offset}) to {args.out}")  # fmt: skip
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from nystrom.model import convert_legacy_checkpoint, from_bert, from_hf, to_hf
    from nystrom_lab.text.models import load_folder, parse_attention

    attention = None
    if getattr(args, "attention", None):
        attention = parse_attention(args.attention, conv_kernel=args.conv_kernel)

    def save(model, out):
        model.save_pretrained(out)

    if args.kind == "from-bert":
        return _write(from_bert(args.source, attention=attention), args, save)
    if args.kind == "from-hf":
        return _write(from_hf(args.source, attention=attention), args, save)
    if args.kind == "to-hf":
        n = args.segment_means_seq_len
        return _write(
            load_folder(Path(args.source)), args, lambda m, out: to_hf(m, out, segment_means_seq_len=n)
        )
    convert_legacy_checkpoint(args.source, args.out)
    print(f"wrote {args.out}")
    return 0


def register(subparsers) -> None:
    c = subparsers.add_parser(
        "convert", help="write transformers folders from BERT / HF Nystromformer / old nystrom checkpoints, or to HF",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    kinds = c.add_subparsers(dest="kind", required=True)
    for kind, help_ in (
        ("from-bert", "a BERT folder -> a Nystromformer folder (the paper's 'from standard' start)"),
        ("from-hf", "a transformers Nystromformer folder (model_type nystromformer) -> ours"),
        ("to-hf", "a folder of ours -> a transformers Nystromformer folder"),
        ("legacy", 'an old nystrom folder ("format": "nystrom") -> a transformers folder'),
    ):
        k = kinds.add_parser(kind, help=help_)
        k.add_argument("source", type=existing_dir, help="folder to read")
        k.add_argument("out", type=output_dir, help="folder to write")
        if kind != "legacy":
            k.add_argument(
                "--tokenizer", type=existing_file, help="tokenizer.json (default: the one in SOURCE)"
            )
        if kind in ("from-bert", "from-hf"):
            k.add_argument(
                "--attention", help="nystrom-<landmarks> or softmax (default: the source's / nystrom-64)"
            )
            k.add_argument("--conv-kernel", type=lambda t: None if t in ("0", "none") else positive_int(t),
                           default=None, help="conv skip kernel with --attention nystrom-m (default none)")  # fmt: skip
        if kind == "to-hf":
            k.add_argument("--segment-means-seq-len", type=positive_int, help="HF's fixed Nyström length")
    c.set_defaults(func=cmd_convert)
    k = kinds.add_parser(
        "long", help="a 512-token BERT/RoBERTa/XLM-R/Nystromformer -> a long model (positions copied, Nyström)",
        description="Longformer's recipe: extend the learned position table to --max-length by copying the"
        " source's rows, switch the attention (a conv skip starts at zero), add an MLM head if the source"
        " has none. Continue with: nystrom pretrain --init-from OUT --max-length N --corpus ...",
    )  # fmt: skip
    k.add_argument("source", type=existing_dir, help="folder to read (config.json + weights)")
    k.add_argument("--max-length", type=positive_int, required=True, help="positions of the long model (N)")
    k.add_argument("--out", type=output_dir, required=True, help="folder to write")
    k.add_argument("--attention", choices=("nystrom", "softmax"), default="nystrom", help="default nystrom")
    k.add_argument("--num-landmarks", type=positive_int, help="Nyström landmarks m (default 64)")
    k.add_argument("--conv-kernel", type=lambda t: None if t in ("0", "none") else positive_int(t), default=65,
                   help="Nyström conv skip taps, zero-initialised (0 = none; default 65)")  # fmt: skip
    k.add_argument("--tokenizer", type=existing_file, help="tokenizer.json (default: the source's)")
    k.add_argument("--seed", type=int, default=0, help="seed of a new MLM head (default 0)")
    k.set_defaults(func=cmd_convert_long)
