"""Export to ONNX, for ONNX Runtime and Optimum: :func:`export_onnx`.

Legend: b batch, r choices (multiple choice), n tokens, e hidden size, v vocabulary, c classes.

The model is traced by ``torch.export`` with the batch and the length dynamic (``torch.export.Dim.DYNAMIC``:
the trace fails rather than keep the example's size), then translated by ``torch.onnx`` (onnxscript) and
optimised. Under ``torch.export`` ``torch.compiler.is_compiling()`` is True, so Nyström attention takes its
traceable path (:mod:`nystrom.ops.nystrom.traceable`) and the checks that read tensor values are skipped.
Models of ours branch on "every token real" (:mod:`~nystrom.convert.onnx_graph`).

The folder is Optimum's layout: ``model.onnx`` (weights beside it as ``model.onnx_data`` above 2 GB),
``config.json`` and the tokenizer files, so ``optimum.onnxruntime.ORTModelFor*.from_pretrained(out_dir)``
and a plain ``onnxruntime.InferenceSession(out_dir / "model.onnx")`` read it.

Not exported (each refused with a reason, or absent from the graph):

- packed documents: the graph takes no ``position_ids``, ``cu_seq_lens_q/k``, ``seq_idx`` (every row is one
  sequence, positions 0..n-1, padding on the right by ``attention_mask``);
- ``labels``/the loss, ``output_hidden_states``, ``output_attentions``, ``inputs_embeds``;
- attention variants whose code branches on the length in Python (:data:`NOT_EXPORTED`: Reformer's buckets);
- the LRA two-tower :class:`NystromformerForDualSequenceClassification`, decoders and causal models.

Longformer's window (the lower layers of ``to_long``'s default long models) exports when the example holds
at least two of its blocks: the trace fixes a dimension of size 1, so one block would pin the length.
:func:`example_length_for` gives the shortest such example, and it is the default.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nystrom.convert import onnx_io
from nystrom.convert.onnx_graph import ExportedForward, finish_graph
from nystrom.model.configuration_nystromformer import MODEL_TYPE

#: attention variants of ours that do not export with a dynamic length, and why
NOT_EXPORTED: dict[str, str] = {
    "reformer": "its number of hash buckets is computed from the sequence length in Python, which the trace "
    "cannot keep symbolic",
}
#: transformers attention implementations that trace (the rest are CUDA kernels or need a GPU)
TRACEABLE_ATTN = ("nystrom", "sdpa", "eager")
#: the example's length unless a layer needs a longer one (:func:`example_length_for`)
DEFAULT_EXAMPLE_LENGTH = 16
#: the shortest example: batch 2 and 3 choices must not equal the length (the trace would tie them)
MIN_EXAMPLE_LENGTH = 4


def example_length_for(model: nn.Module) -> int:
    """The shortest example that keeps every dimension of the trace dynamic: :data:`MIN_EXAMPLE_LENGTH`, and
    for a model with Longformer layers one token more than the largest block (two blocks: a dimension of
    size 1 would be fixed by the trace)."""
    from nystrom.attention.longformer import LongformerAttention
    from nystrom.ops.baselines.longformer import block_size

    windows = [m.window_size for m in model.modules() if isinstance(m, LongformerAttention)]
    return max([MIN_EXAMPLE_LENGTH, *(block_size(w) + 1 for w in windows)])


def check_exportable(model: nn.Module) -> None:
    """Raise ValueError, with the reason, for a model :func:`export_onnx` cannot export."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "forward"):
        raise TypeError(f"export_onnx takes a transformers model (or a folder), got {type(model).__name__}")
    name = type(model).__name__
    if name == "NystromformerForDualSequenceClassification":
        raise ValueError(
            f"{name} (the LRA retrieval two-tower) takes two documents (input_ids_1, input_ids_2): not exported; "
            "export its encoder (a NystromformerModel with these weights) instead"
        )
    if "input_ids" not in inspect.signature(model.forward).parameters:
        raise ValueError(
            f"{name} takes no input_ids: export_onnx exports text encoders (input_ids, attention_mask)"
        )
    if getattr(config, "is_decoder", False) or getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{name} is a decoder or encoder-decoder: export_onnx exports encoders")
    if config.model_type == MODEL_TYPE:
        for i in range(config.num_hidden_layers):
            attention = config.layer_attention(i)["name"]
            if attention in NOT_EXPORTED:
                raise ValueError(
                    f"layer {i} of {name} uses attention {attention!r}, which does not export to ONNX with a "
                    f"dynamic length: {NOT_EXPORTED[attention]}. Exported variants: nystrom, softmax, longformer, "
                    "linear, linformer, performer"
                )
        return
    attn = getattr(config, "_attn_implementation", None)
    if attn not in TRACEABLE_ATTN:
        raise ValueError(
            f"{name} runs attn_implementation={attn!r}, which torch.export cannot trace on the CPU; load it with"
            f" attn_implementation='nystrom' (or one of {list(TRACEABLE_ATTN)})"
        )


def _say(progress: bool, text: str) -> None:
    if progress:
        print(f"[nystrom] onnx: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _quiet_registry():
    """torch.onnx logs a warning per torchvision op it cannot register; not ours to show (restored after)."""
    log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def export_onnx(
    model_or_path: nn.Module | str | Path,
    out_dir: str | Path,
    *,
    task: str = "auto",
    attn_implementation: str | None = None,
    opset: int | None = None,
    example_length: int | None = None,
    tokenizer: Any = None,
    verify: bool = True,
    unpadded_branch: bool | None = None,
    progress: bool = True,
) -> Path:
    """Export a text encoder to ``out_dir/model.onnx`` (+ ``config.json`` and the tokenizer), Optimum's layout.

    Args:
        model_or_path: a model of ours (``NystromformerModel`` or a head: MaskedLM, PreTraining,
            SequenceClassification, TokenClassification, QuestionAnswering, MultipleChoice), a transformers
            BERT-family model (``attn_implementation="nystrom"`` for Nyström attention), or a folder holding
            one (``save_pretrained``'s output, ours read by the Auto classes that ``import nystrom`` fills).
        out_dir: the folder to write (created; existing files of the same names are replaced).
        task: for a folder: ``"auto"`` (the class its config.json names) or an Optimum task of
            :data:`~nystrom.convert.onnx_io.TASKS` (``feature-extraction``, ``fill-mask``,
            ``text-classification``, ...); a task whose head the folder has no weights for raises.
        attn_implementation: for a transformers folder: how to load it (``"nystrom"``); None = its default.
        opset: the ONNX opset (default: torch.onnx's, 20 with torch 2.13).
        example_length: n of the traced example (batch 2, the second row padded); any length runs afterwards.
            None: 16, or for Longformer layers two of their blocks (:func:`example_length_for`); a given
            length below that raises.
        tokenizer: a transformers tokenizer, a ``tokenizer.json`` or a folder; None = the one in the model's
            folder (a note is printed when there is none).
        verify: run the file in ONNX Runtime against the eager model at two other lengths (batch 3, padded
            rows) and raise RuntimeError if they differ by more than 1e-4 relative (float32).
        unpadded_branch: compute the outputs under an ONNX ``If`` on "every token real", whose unpadded
            subgraph is the model without a mask, as the eager model runs an all-True mask
            (:mod:`~nystrom.convert.onnx_graph`: 1-16 % of ORT's time). False: the masked graph alone (a
            smaller file, an export about three times as fast). None: True for models of ours, False for
            transformers' models, whose forward (transformers 5's output capturing) TorchDynamo cannot trace
            inside ``torch.cond``; True for one of those raises RuntimeError.
        progress: print each step to stderr.

    Graph: inputs ``input_ids``, ``attention_mask`` (1 = real token) and ``token_type_ids`` where the model
    has more than one token type, int64 (b, n) (``batch_size``, ``sequence_length``; multiple choice (b, r, n),
    ``num_choices``); outputs named as the model's output fields (Optimum's names): ``last_hidden_state``
    (b, n, e) and ``pooler_output`` (b, e), or ``logits`` ((b, n, v) MLM, (b, c) sequence, (b, n, c) token,
    (b, r) choices), or ``start_logits``/``end_logits`` (b, n). Not exported: packed documents (no
    ``position_ids``/``cu_seq_lens``/``seq_idx`` inputs), losses, hidden states and attentions, the attention
    variants of :data:`NOT_EXPORTED` (see the module docstring).

    Returns:
        the path of ``model.onnx``. Raises ImportError without onnx/onnxscript (and onnxruntime to verify).
    """
    onnx, _ = onnx_io.require("onnx", "onnxscript")
    if verify:
        onnx_io.require("onnxruntime")
    if example_length is not None and (not isinstance(example_length, int) or example_length < MIN_EXAMPLE_LENGTH):
        raise ValueError(f"example_length must be an int >= {MIN_EXAMPLE_LENGTH}, got {example_length!r}")
    source = None
    if isinstance(model_or_path, (str, Path)):
        _say(progress, f"loading {model_or_path} (task {task})")
        model, source = onnx_io.load_model(model_or_path, task=task, attn_implementation=attn_implementation)
    elif task != "auto" or attn_implementation is not None:
        raise ValueError(
            "task and attn_implementation choose how a folder is loaded; a model is exported as it is"
        )
    else:
        model = model_or_path
        name_or_path = Path(str(getattr(model.config, "_name_or_path", "") or ""))
        source = name_or_path if str(name_or_path) and (name_or_path / "config.json").is_file() else None
    check_exportable(model)
    if unpadded_branch is None:
        unpadded_branch = model.config.model_type == MODEL_TYPE
        if not unpadded_branch:
            _say(progress, "no branch on every token real: transformers' forward does not trace inside torch.cond")
    need = example_length_for(model)
    if example_length is None:
        example_length = max(DEFAULT_EXAMPLE_LENGTH, need)
    elif example_length < need:
        raise ValueError(
            f"example_length {example_length} is below {need}: the example must hold two blocks of every "
            "Longformer layer's window (a single block would fix the length in the graph); leave it None"
        )
    limit = onnx_io.max_tokens(model)
    if limit is not None and example_length > limit:
        raise ValueError(f"example_length {example_length} exceeds the model's {limit} positions")
    out_dir = Path(out_dir)
    if source is not None and out_dir.resolve() == source.resolve():
        raise ValueError(f"out_dir {out_dir} is the model's own folder: write the ONNX folder elsewhere")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    was_training = model.training
    model.eval()
    try:
        names = onnx_io.input_names(model)
        example = onnx_io.example_inputs(model, names, batch=2, length=example_length, seed=0)
        with torch.no_grad():
            out = model(**example, return_dict=True)
            if unpadded_branch:  # the unpadded path's first call fills its caches outside the trace too
                model(**{**example, "attention_mask": None}, return_dict=True)
        outputs = [
            k for k, v in out.items() if k not in onnx_io.SKIPPED_OUTPUTS and isinstance(v, torch.Tensor)
        ]
        _trace_and_save(
            model, example, outputs, path, opset=opset, unpadded_branch=unpadded_branch, progress=progress
        )
        _say(progress, "checking the file (onnx.checker, full check)")
        onnx.checker.check_model(str(path), full_check=True)
        if verify:
            lengths = [
                example_length - 3,
                3 * example_length + 1 if limit is None else min(limit, 3 * example_length + 1),
            ]
            worst = onnx_io.verify_with_ort(path, model, names, outputs, lengths=lengths)
            _say(
                progress,
                f"ONNX Runtime = eager at lengths {lengths}, batch 3 padded, and at {lengths[0]}, batch 2 unpadded "
                f"(largest relative difference {worst:.1e})",
            )
    finally:
        model.train(was_training)
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]  # as save_pretrained records it (Optimum reads the task)
    config.save_pretrained(str(out_dir))
    note = onnx_io.save_tokenizer_beside(tokenizer, source, out_dir, max_length=limit)
    _say(progress, f"wrote {path} ({', '.join(names)} -> {', '.join(outputs)}), config.json, {note}")
    return path


def _trace_and_save(
    model: nn.Module, example: dict[str, torch.Tensor], outputs: list[str], path: Path, *, opset: int | None,
    unpadded_branch: bool, progress: bool,
) -> None:  # fmt: skip
    """torch.export with dynamic batch and length, torch.onnx, the axes named as Optimum names them, saved."""
    axes = (
        ["batch_size", "num_choices", "sequence_length"]
        if onnx_io.choices(model)
        else ["batch_size", "sequence_length"]
    )
    dims = dict.fromkeys(range(len(axes)), torch.export.Dim.DYNAMIC)
    t0 = time.perf_counter()
    branch = ", branching on every token real" if unpadded_branch else ""
    _say(progress, f"tracing {type(model).__name__} with torch.export (dynamic {', '.join(axes)}{branch})")
    try:
        program = torch.export.export(
            ExportedForward(model, outputs, unpadded_branch=unpadded_branch),
            (),
            kwargs=example,
            dynamic_shapes={k: dims for k in example},
            strict=False,
        )
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RuntimeError(
            f"torch.export could not trace {type(model).__name__} with a dynamic batch and length: {first} "
            "(a Python branch or int() on a shape or value in the model's forward). The models of ours and BERT "
            "with attn_implementation='nystrom' export; report anything else with its config.json"
            + (
                ". The branch on every token real traces the forward with torch.cond (TorchDynamo): "
                "unpadded_branch=False (--no-unpadded-branch) traces without it"
                if unpadded_branch
                else ""
            )
        ) from err
    _say(progress, f"traced in {time.perf_counter() - t0:.1f} s; translating to ONNX and optimising")
    with _quiet_registry():
        onnx_program = torch.onnx.export(
            program, (), kwargs=example, dynamo=True, opset_version=opset, optimize=True, output_names=outputs,
            verbose=False,
        )  # fmt: skip
    rename = {}
    for value in onnx_program.model.graph.inputs:
        for dim, axis in zip(value.shape, axes):
            if not isinstance(dim, int) and dim.value is not None:
                rename[dim.value] = axis
    onnx_program.rename_axes(rename)
    onnx_program.save(str(path))
    finish_graph(path, branches=unpadded_branch)
    _say(progress, f"{path.name} written in {time.perf_counter() - t0:.1f} s")
