"""``nystrom convert``: write transformers folders (model + tokenizer) from BERT, transformers'
Nystromformer and old nystrom checkpoints, and transformers Nystromformer folders from ours.

Every folder written holds a tokenizer when the source has one (``tokenizer.json``) or ``--tokenizer``
names one, so ``AutoTokenizer`` and ``pipeline(..., model=OUT)`` work on it; otherwise a note says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nystrom.argtypes import existing_dir, existing_file, output_dir, positive_int


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


def cmd_convert(args: argparse.Namespace) -> int:
    from nystrom.model import convert_legacy_checkpoint, from_bert, from_hf, to_hf
    from nystrom.tasks.text_models import load_folder, parse_attention

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
