"""What :func:`~nystrom.convert.onnx_export.export_onnx` needs around the trace: the optional packages, the
model a folder holds (by task), the inputs and outputs of the graph, the tokenizer beside it and the check of
ONNX Runtime against the eager model.

Legend: b batch, r choices (multiple choice), n tokens, e hidden size, v vocabulary, c classes.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nystrom.model.configuration_nystromformer import MODEL_TYPE

INSTALL_HINT = 'pip install onnx onnxscript onnxruntime (or pip install "nystrom[onnx]")'

#: Optimum's task names -> the transformers Auto class that loads a folder for it ("auto": the class the
#: folder's config.json names in ``architectures``)
TASKS: dict[str, str] = {
    "feature-extraction": "AutoModel",
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "multiple-choice": "AutoModelForMultipleChoice",
}

#: fields of a model's output that are never graph outputs (the loss needs labels; the per-layer lists
#: are off by default and would change the graph's outputs with the config)
SKIPPED_OUTPUTS = ("loss", "hidden_states", "attentions", "past_key_values", "cross_attentions")

#: files of which a folder holds at least one when it has a tokenizer (``AutoTokenizer`` alone would build an
#: empty one from a bare config.json)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")  # fmt: skip


def require(*names: str) -> list[Any]:
    """The modules ``names`` imported, or ImportError saying how to install them."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise ImportError(f"ONNX export needs {', '.join(missing)}, which is not installed: {INSTALL_HINT}")
    return [importlib.import_module(n) for n in names]


def load_model(path: str | Path, *, task: str, attn_implementation: str | None) -> tuple[nn.Module, Path]:
    """The model the folder ``path`` holds, for ``task`` (``"auto"``: the class its config.json names), on
    the CPU in eval mode; and the folder. ValueError when the folder lacks weights the task's head needs
    (loading would draw them at random: an export of an untrained head)."""
    import transformers
    from transformers import AutoConfig

    from nystrom.model.modeling_heads import MODEL_CLASSES

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} holds no config.json: give a model folder (save_pretrained's output)")
    if task != "auto" and task not in TASKS:
        raise ValueError(f"task {task!r} is not one of {['auto', *TASKS]}")
    config = AutoConfig.from_pretrained(folder)
    ours = config.model_type == MODEL_TYPE
    if ours and attn_implementation is not None:
        raise ValueError(
            f"{folder} is a model of ours: its attention comes from config.attention "
            f"({config.attention!r}); attn_implementation is for transformers models (BERT, RoBERTa, ...)"
        )
    if task == "auto":
        names = list(config.architectures or [])
        if not names:
            cls = transformers.AutoModel
        elif names[0] in MODEL_CLASSES:
            cls = MODEL_CLASSES[names[0]]
        elif hasattr(transformers, names[0]):
            cls = getattr(transformers, names[0])
        else:
            raise ValueError(
                f"{folder}/config.json names architecture {names[0]!r}, which neither nystrom nor transformers "
                f"has; give a task ({', '.join(TASKS)})"
            )
    else:
        cls = getattr(transformers, TASKS[task])
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model, info = cls.from_pretrained(folder, output_loading_info=True, **kwargs)
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise ValueError(
            f"{folder} has no weights for {missing[:4]}{' ...' if len(missing) > 4 else ''} of "
            f"{type(model).__name__} (task {task}): they would be drawn at random. The folder holds "
            f"{config.architectures}: export it with task 'auto', or fine-tune that head first"
        )
    return model.eval(), folder


def input_names(model: nn.Module) -> list[str]:
    """``input_ids``, ``attention_mask`` and, where the model embeds more than one token type,
    ``token_type_ids`` (Optimum's inputs: BERT has them, RoBERTa and XLM-R (one type) do not)."""
    names = ["input_ids", "attention_mask"]
    takes = "token_type_ids" in inspect.signature(model.forward).parameters
    if takes and (getattr(model.config, "type_vocab_size", 0) or 0) > 1:
        names.append("token_type_ids")
    return names


def choices(model: nn.Module) -> bool:
    """Whether the model reads (b, r, n) inputs (multiple choice) rather than (b, n)."""
    return type(model).__name__.endswith("ForMultipleChoice")


def max_tokens(model: nn.Module) -> int | None:
    """The longest input the model's position table takes (transformers' RoBERTa-family reserve the first
    2 rows: counted off for every transformers model, a safe bound), or None without a table."""
    total = getattr(model.config, "max_position_embeddings", None)
    if total is None:
        return None
    return int(total) if model.config.model_type == MODEL_TYPE else int(total) - 2


def example_inputs(
    model: nn.Module, names: list[str], *, batch: int, length: int, seed: int, padded: bool = True
) -> dict[str, torch.Tensor]:
    """Random inputs (b, n) (or (b, 3, n) for multiple choice) on the model's device: ids in the vocabulary,
    every row after the first right-padded to a shorter length (1 = real token; ``padded=False``: every
    token real), random token types."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, 3, length) if choices(model) else (batch, length)
    vocab = int(model.config.vocab_size)
    out = {"input_ids": torch.randint(0, vocab, shape, generator=gen)}
    mask = torch.ones(shape, dtype=torch.long)
    for row in range(1, batch if padded else 1):
        mask[row, ..., max(1, length - row * length // (batch + 1)) :] = 0
    out["attention_mask"] = mask
    if "token_type_ids" in names:
        out["token_type_ids"] = torch.randint(0, 2, shape, generator=gen)
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in out.items()}


def save_tokenizer_beside(
    tokenizer: Any, source: Path | None, out_dir: Path, *, max_length: int | None
) -> str:
    """Write the tokenizer into ``out_dir``: ``tokenizer`` (a transformers tokenizer, a ``tokenizer.json`` or a
    folder) or, when None, the one in ``source``. Returns what was written, or a note that none was."""
    from transformers import AutoTokenizer

    from nystrom.convert.tokenizer import save_tokenizer

    if tokenizer is None and source is None:
        return "no tokenizer (the model came without a folder; give tokenizer=)"
    if tokenizer is None:
        if not any((source / name).is_file() for name in TOKENIZER_FILES):
            return f"no tokenizer ({source} has none; give tokenizer=)"
        tokenizer = source
    if isinstance(tokenizer, (str, Path)):
        path = Path(tokenizer)
        if path.is_file():
            save_tokenizer(path, out_dir, model_max_length=max_length or 512)
            return f"tokenizer from {path}"
        if not path.is_dir() or not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(
                f"tokenizer={str(tokenizer)!r} is neither a tokenizer.json nor a folder holding a tokenizer "
                f"(one of {', '.join(TOKENIZER_FILES)})"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not hasattr(tokenizer, "save_pretrained"):
        raise TypeError(
            f"tokenizer must be a transformers tokenizer, a tokenizer.json or a folder, got {type(tokenizer).__name__}"
        )
    tokenizer.save_pretrained(str(out_dir))
    return f"tokenizer {type(tokenizer).__name__}"


def real_tokens(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The entries of an output at real tokens: per-token outputs ((b, n, ...) or (b, r, n, ...), matching
    the mask's shape) are indexed by the mask; pooled ones ((b, c), (b, e)) are returned whole."""
    if tuple(value.shape[: mask.dim()]) == tuple(mask.shape):
        return value[mask.bool()]
    return value


def verify_with_ort(
    path: Path, model: nn.Module, names: list[str], outputs: list[str], *, lengths: list[int]
) -> float:
    """Run ``path`` in ONNX Runtime (CPU) at batch 3 and each of ``lengths`` (padded rows), and at batch 2 and
    the first length with every token real (the graph's unpadded branch), against the eager model; the largest
    difference on real tokens relative to (1 + the largest eager magnitude). Raises RuntimeError above 1e-4
    (float32; 2e-2 in half precision)."""
    (ort,) = require("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    dtype = next(model.parameters()).dtype
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2
    worst = 0.0
    cases = [(3, length, True) for length in lengths] + [(2, lengths[0], False)]
    for batch, length, padded in cases:
        feed = example_inputs(model, names, batch=batch, length=length, seed=length, padded=padded)
        with torch.no_grad():
            ref = model(**feed, return_dict=True)
        got = session.run(outputs, {k: v.cpu().numpy() for k, v in feed.items()})
        mask = feed["attention_mask"].cpu()
        for name, value in zip(outputs, got):
            want = real_tokens(ref[name].detach().float().cpu(), mask)
            have = real_tokens(torch.from_numpy(value).float(), mask)
            err = float((have - want).abs().max()) / (1.0 + float(want.abs().max()))
            worst = max(worst, err)
            if not err <= tol:  # NaN fails too
                case = f"batch {batch}, length {length}" + ("" if padded else ", no padding")
                raise RuntimeError(
                    f"{path}: ONNX Runtime's {name} differs from the eager model's by {err:.2e} (relative, "
                    f"tolerance {tol:.0e}) at {case}: the trace kept something of the example "
                    "input's shape. Report it with the model's config.json; export_onnx(..., verify=False) "
                    "skips this check"
                )
    return worst
