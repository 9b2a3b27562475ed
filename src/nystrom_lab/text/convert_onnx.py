"""``nystrom convert onnx``: a saved model folder -> an ONNX folder in Optimum's layout (``model.onnx``,
``config.json``, the tokenizer), checked by onnx.checker and by ONNX Runtime against the eager model
(:func:`nystrom.convert.export_onnx`). Parsing imports neither torch nor the library.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nystrom_lab.argtypes import UsageError, existing_file, int_in_range, output_dir, positive_int

#: nystrom.convert.onnx_io.TASKS, listed here so that the parser needs no torch (a test compares)
TASKS = (
    "feature-extraction",
    "fill-mask",
    "text-classification",
    "token-classification",
    "question-answering",
    "multiple-choice",
)
#: nystrom.convert.onnx_export.TRACEABLE_ATTN (a test compares)
ATTN_IMPLEMENTATIONS = ("nystrom", "sdpa", "eager")

HELP = "a saved model folder -> model.onnx + config.json + tokenizer (Optimum's layout), dynamic batch and length"


def _model_folder(init_from: str) -> Path:
    """The folder of a start point with weights (``minilm`` resolved); a configuration or a transformers
    Nystromformer folder is refused."""
    from nystrom_lab.start_point import MINILM, detect

    point = detect(init_from)
    if not point.has_weights:
        raise UsageError(
            f"--init-from {init_from}: export needs a model folder (or minilm), not a configuration"
        )
    if point.kind == "hf":
        raise UsageError(
            f"--init-from {init_from} is transformers' own Nystromformer (fixed-length segment means): convert it"
            " to ours first (`nystrom convert to-nystrom --init-from SRC --out DIR`), then export DIR"
        )
    if point.source != MINILM:
        return Path(point.source)
    from nystrom.model import minilm_path

    return minilm_path()


def cmd_convert_onnx(args: argparse.Namespace) -> int:
    folder = _model_folder(args.init_from)
    from nystrom.convert import export_onnx  # imports the library (and registers our Auto classes)

    path = export_onnx(
        folder, args.out, task=args.task, attn_implementation=args.attn_implementation, opset=args.opset,
        example_length=args.example_length, tokenizer=args.tokenizer, verify=not args.no_verify,
        unpadded_branch=False if args.no_unpadded_branch else None,
    )  # fmt: skip
    import onnx

    graph = onnx.load(str(path), load_external_data=False)

    def describe(values) -> str:
        return ", ".join(
            f"{v.name} ({', '.join(d.dim_param or str(d.dim_value) for d in v.type.tensor_type.shape.dim)})"
            for v in values
        )

    opset = next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))
    size = sum(p.stat().st_size for p in path.parent.glob("model.onnx*")) / 2**20
    print(f"wrote {path} ({size:.1f} MiB, opset {opset})")
    print(f"  inputs:  {describe(graph.graph.input)}")
    print(f"  outputs: {describe(graph.graph.output)}")
    if args.quantize:
        from nystrom.convert import quantize_onnx

        q = quantize_onnx(path)
        print(f"wrote {q} ({q.stat().st_size / 2**20:.1f} MiB): int8 dynamic quantization of the MatMul weights")
    print(f"  beside it: {', '.join(sorted(p.name for p in path.parent.iterdir() if p.name != path.name))}")
    return 0


def register(kinds) -> None:
    """Add ``onnx`` to ``nystrom convert``'s kinds (``kinds``: its sub-parsers)."""
    from nystrom_lab.start_point import init_from

    k = kinds.add_parser(
        "onnx", help=HELP,
        description="Export a model folder to ONNX for ONNX Runtime / Optimum (ORTModelFor*.from_pretrained(OUT)"
        " after `import nystrom`; see docs/deployment.md). Inputs input_ids, attention_mask (and token_type_ids"
        " where the model has token types), dynamic batch and length; outputs named as Optimum names them."
        " Packed documents (position_ids, cu_seq_lens) are not exported.",
    )  # fmt: skip
    k.add_argument(
        "--init-from", type=init_from, required=True, metavar="MODEL_DIR",
        help="the model folder to export: ours (any head), a BERT/RoBERTa/XLM-R folder, minilm, or a run folder",
    )  # fmt: skip
    k.add_argument("--out", type=output_dir, required=True, help="folder to write (created)")
    k.add_argument(
        "--task", choices=("auto", *TASKS), default="auto",
        help="auto (default): the class the folder's config.json names; else the Optimum task whose head to"
        " export (refused when the folder has no weights for that head)",
    )  # fmt: skip
    k.add_argument(
        "--attn-implementation", choices=ATTN_IMPLEMENTATIONS,
        help="for a BERT-family folder: nystrom (Nyström attention; options from config.nystrom_attention) or"
        " transformers' sdpa/eager (default: the folder's own, sdpa). Our folders take theirs from config.json",
    )  # fmt: skip
    k.add_argument(
        "--opset", type=positive_int, help="ONNX opset (default: torch.onnx's, 20 with torch 2.13)"
    )
    k.add_argument(
        "--example-length", type=int_in_range(4, 1 << 20), default=None,
        help="tokens of the traced example (default 16, or two blocks of a Longformer layer's window: one more"
        " than half the window); any length runs afterwards",
    )  # fmt: skip
    k.add_argument("--tokenizer", type=existing_file, help="tokenizer.json (default: the folder's tokenizer)")
    k.add_argument(
        "--no-verify", action="store_true",
        help="skip the ONNX Runtime check against the eager model at two other lengths",
    )  # fmt: skip
    k.add_argument(
        "--no-unpadded-branch", action="store_true",
        help="export the masked graph alone, without the If on every token real whose branch runs unpadded"
        " batches without the mask's work (a smaller file and a faster export; slower on unpadded inputs). The"
        " If is exported for models of ours; transformers' models (BERT folders) never get it",
    )  # fmt: skip
    k.add_argument(
        "--quantize", action="store_true",
        help="also write model_quantized.onnx: int8 dynamic quantization of the MatMul weights (Optimum's name;"
        " measure the accuracy it costs on your task, docs/deployment.md)",
    )  # fmt: skip
    k.set_defaults(func=cmd_convert_onnx)
