"""``nystrom convert``: write transformers folders (model + tokenizer), each read from ``--init-from``:

  to-nystrom  a BERT/RoBERTa/XLM-R or transformers Nystromformer folder (the kind read from its config.json)
              -> a folder of ours, with --attention
  to-hf       a folder of ours -> a transformers Nystromformer folder
  long        a 512-token model -> a long-context one (Longformer's recipe: :func:`nystrom.model.to_long`)
  legacy      an old nystrom checkpoint -> a folder of ours
  onnx        a model folder -> model.onnx + config.json + tokenizer for ONNX Runtime / Optimum
              (:mod:`nystrom_lab.text.convert_onnx`)

Every folder written holds a tokenizer when the source has one (``tokenizer.json``) or ``--tokenizer``
names one, so ``AutoTokenizer`` and ``pipeline(..., model=OUT)`` work on it; otherwise a note says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nystrom_lab.argtypes import UsageError, existing_dir, existing_file, output_dir, positive_int


def _write(model, args: argparse.Namespace, tokenizer: Path | None, write) -> int:
    from nystrom.model import save_tokenizer

    tok = args.tokenizer or tokenizer  # --tokenizer is checked by argparse (existing_file)
    write(model, args.out)
    if tok is None:
        print(f"[nystrom] note: {args.init_from} has no tokenizer.json; {args.out} has no tokenizer"
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


def _weights_folder(init_from: str) -> Path:
    """The model folder of a start point that has weights (``minilm`` resolved); a configuration is refused."""
    from nystrom_lab.start_point import MINILM, detect

    point = detect(init_from)
    if not point.has_weights:
        raise UsageError(
            f"--init-from {init_from}: convert needs a model folder (or minilm), not a configuration"
        )
    if point.source != MINILM:
        return Path(point.source)
    from nystrom.model import minilm_path

    return minilm_path()


def cmd_convert_long(args: argparse.Namespace) -> int:
    from nystrom.convert.interop_bert import BERT_FAMILY
    from nystrom.model import source_length, to_long
    from nystrom_lab.text.models import text_attention

    source = _weights_folder(args.init_from)
    model_type, length = source_length(source)  # config.json checks before any weight is read
    if args.max_length <= length:
        raise UsageError(f"--max-length {args.max_length} must be above the source's {length} positions")
    from nystrom.model.positions import check_scheme

    try:  # before any weight is read
        check_scheme(args.positions, args.alpha, source_rows=length, rows=args.max_length)
    except ValueError as err:
        raise UsageError(f"--positions {args.positions} --alpha {args.alpha}: {err}") from err
    if args.attention:
        specs = [text_attention(a, max_length=args.max_length) for a in args.attention]
        attention = specs[0] if len(specs) == 1 else specs
    elif model_type in BERT_FAMILY:
        attention = None  # to_long's default: long_attention (windows below, Nyström above)
    else:
        attention = text_attention("nystrom", max_length=args.max_length)
    model = to_long(
        source, max_position_embeddings=args.max_length, attention=attention, positions=args.positions,
        alpha=args.alpha, seed=args.seed,
    )  # fmt: skip
    (model.nystromformer if args.sentence_transformers else model).save_pretrained(args.out)
    if not save_long_tokenizer(source, args.out, max_length=args.max_length, tokenizer=args.tokenizer):
        if args.sentence_transformers:
            raise UsageError(f"{source} has no tokenizer and sentence-transformers needs one: give --tokenizer"
                             f" tokenizer.json ({args.out} holds the model alone)")  # fmt: skip
        print(
            f"[nystrom] note: {source} has no tokenizer; {args.out} has none (give --tokenizer)",
            file=sys.stderr,
        )
    pos = model.nystromformer.embeddings
    how = {"copy": f"copied {args.max_length / length:.1f}x", "interpolate": "interpolated",
           "hierarchical": f"decomposed hierarchically, alpha {model.config.position_extension.get('alpha')}"}
    layers = [model.config.layer_attention(i)["name"] for i in range(model.config.num_hidden_layers)]
    kinds = layers[0] if len(set(layers)) == 1 else " ".join(layers)
    written = type(model.nystromformer if args.sentence_transformers else model).__name__
    print(f"wrote {written} ({kinds}, {args.max_length} positions: the source's"
          f" {length} rows {how[args.positions]}, offset {pos.offset}) to {args.out}")  # fmt: skip
    if args.sentence_transformers:
        from nystrom.convert.sentence_transformers import write_sentence_transformers

        st = write_sentence_transformers(args.out, source=source)
        print(f"sentence-transformers: Transformer (max_seq_length {st.max_seq_length}) + Pooling ({st.pooling_mode},"
              f" {'from ' + st.pooling_source if st.pooling_source else 'the default'})"
              f"{' + Normalize' if st.normalize else ''}; load with `import nystrom` then"
              f" SentenceTransformer({str(args.out)!r})")  # fmt: skip
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from nystrom.model import convert_legacy_checkpoint, to_hf
    from nystrom_lab.text.models import load_start

    if args.kind == "legacy":
        convert_legacy_checkpoint(args.init_from, args.out)
        print(f"wrote {args.out}")
        return 0
    _weights_folder(args.init_from)
    start = load_start(args.init_from, attention=getattr(args, "attention", None))
    if args.kind == "to-nystrom":
        return _write(start.model, args, start.tokenizer, lambda m, out: m.save_pretrained(out))
    n = args.segment_means_seq_len
    return _write(start.model, args, start.tokenizer, lambda m, out: to_hf(m, out, segment_means_seq_len=n))


_KINDS = (
    ("to-nystrom", "a BERT/RoBERTa/XLM-R or transformers Nystromformer folder (or minilm) -> a folder of ours"
     " (the paper's 'from standard' start)"),
    ("to-hf", "a folder of ours (or any --init-from model) -> a transformers Nystromformer folder"),
    ("legacy", 'an old nystrom folder ("format": "nystrom") -> a folder of ours'),
)  # fmt: skip


#: nystrom.model.positions.POSITION_SCHEMES, listed here so that the parser needs no torch (a test compares)
POSITION_SCHEMES = ("copy", "interpolate", "hierarchical")


def register(subparsers) -> None:
    from nystrom_lab.attention_spec import attention
    from nystrom_lab.start_point import FORMS, init_from
    from nystrom_lab.text.options import ATTENTION_HELP

    c = subparsers.add_parser(
        "convert", help="write transformers folders: ours from BERT / HF Nystromformer / old folders, HF's, long models",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    kinds = c.add_subparsers(dest="kind", required=True)
    for kind, help_ in _KINDS:
        k = kinds.add_parser(kind, help=help_)
        legacy = (
            kind == "legacy"
        )  # an old folder is no start point: its config.json is not a transformers one
        k.add_argument(
            "--init-from", type=existing_dir if legacy else init_from, required=True, metavar="START",
            help="the old nystrom folder to read" if legacy else f"the model to read: {FORMS}",
        )  # fmt: skip
        k.add_argument("--out", type=output_dir, required=True, help="folder to write")
        if not legacy:
            k.add_argument(
                "--tokenizer", type=existing_file, help="tokenizer.json (default: the start point's)"
            )
        if kind == "to-nystrom":
            k.add_argument("--attention", type=attention, metavar="SPEC", help=ATTENTION_HELP)
        if kind == "to-hf":
            k.add_argument("--segment-means-seq-len", type=positive_int, help="HF's fixed Nyström length")
        k.set_defaults(func=cmd_convert)
    from nystrom_lab.text.convert_onnx import register as register_onnx

    register_onnx(kinds)  # `nystrom convert onnx`
    k = kinds.add_parser(
        "long", help="a 512-token BERT/RoBERTa/XLM-R/Nystromformer -> a long model (positions copied; windows below,"
        " Nyström above)",
        description="Longformer's recipe: extend the learned position table to --max-length by copying the"
        " source's rows, switch the attention (a conv skip starts at zero), add an MLM head if the source"
        " has none. Continue with: nystrom pretrain --init-from OUT --max-length N --corpus ...",
    )  # fmt: skip
    k.add_argument(
        "--init-from", type=init_from, required=True, metavar="START", help=f"the model to read: {FORMS}"
    )
    k.add_argument("--max-length", type=positive_int, required=True, help="positions of the long model (N)")
    k.add_argument("--out", type=output_dir, required=True, help="folder to write")
    k.add_argument(
        "--attention", type=attention, nargs="+", metavar="SPEC",
        help="attention spec of the long model, or one spec per layer (e.g. 3 x longformer-511 then 3 x nystrom"
        " for a 6-layer model). Default: for a BERT-family source a window of L - 1 tokens in the lower half of"
        " the layers and nystrom above (nystrom.convert.long.long_attention: a converted model keeps its"
        " source's accuracy, docs/long-context.md); for a Nystromformer, nystrom (NystromAttention's"
        " landmarks, conv kernel 65 zero-initialised). softmax keeps exact attention; "
        + ATTENTION_HELP.split(". Default")[0],
    )  # fmt: skip
    k.add_argument(
        "--positions", choices=POSITION_SCHEMES, default="copy",
        help="how the source's L position rows become N: copy (row p = row p mod L, Longformer's; default),"
        " interpolate (the table stretched linearly) or hierarchical (Su's decomposition: rows below L"
        " unchanged, copies told apart by --alpha)",
    )  # fmt: skip
    k.add_argument(
        "--alpha", type=float, help="alpha of --positions hierarchical, in (0, 1) (default 0.4, Su's)"
    )
    k.add_argument("--tokenizer", type=existing_file, help="tokenizer.json (default: the source's)")
    k.add_argument("--seed", type=int, default=0, help="seed of a new MLM head (default 0)")
    k.add_argument(
        "--sentence-transformers", action="store_true",
        help="write a sentence-transformers folder (the encoder without the MLM head; modules.json, the source's"
        " pooling and Normalize when it is a sentence-transformers model, else mean pooling; max_seq_length ="
        " --max-length): `import nystrom` then SentenceTransformer(OUT) (nystrom.convert.sentence_transformers)",
    )  # fmt: skip
    k.set_defaults(func=cmd_convert_long)
