"""Long-context models from pretrained 512-token checkpoints: Longformer's "convert to long" recipe.

Legend: e hidden size, p position rows of the source (its length), N the new length, v vocabulary.

:func:`to_long` takes a BERT, RoBERTa/XLM-R, transformers Nystromformer or nystrom folder (or a model of
ours), and returns a :class:`NystromformerForMaskedLM` whose learned position table is extended to N rows
(by default by copying the source's rows over and over, new position i taking source row ``i mod p``;
``positions="interpolate"`` or ``"hierarchical"`` instead, :mod:`nystrom.model.positions`; RoBERTa-family
and HF Nystromformer tables keep their 2 reserved leading rows, so their rows start at row 2), with
the attention switched to Nyström (or kept exact softmax). A conv skip the source lacks starts at zero,
so at positions below p the converted model computes what the source computes, up to the attention
approximation. A source without an MLM head gets a fresh one (its decoder tied to the word
embeddings), drawn from ``seed`` alone, so conversions with different attentions get the same head.

Every check that can fail (folder, model_type, position type, N) runs on ``config.json`` before any
weight is read or any model allocated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nystrom.convert.interop_bert import BERT_FAMILY, from_bert, from_roberta
from nystrom.convert.interop_hf import from_hf
from nystrom.convert.transfer import load_folder, transfer
from nystrom.convert.weights import CheckpointError, read_json
from nystrom.model.configuration_nystromformer import MODEL_TYPE, normalize_attention
from nystrom.model.modeling_heads import NystromformerForMaskedLM
from nystrom.model.modeling_nystromformer import NystromformerPreTrainedModel
from nystrom.model.positions import check_scheme

#: the global attention of a long model: the paper's Nyström (m = 64) with a conv skip that starts at 0
DEFAULT_LONG_ATTENTION: dict[str, Any] = {"name": "nystrom", "num_landmarks": 64, "conv_kernel_size": 65}


def long_attention(num_layers: int, source_length: int) -> list[dict[str, Any]]:
    """The default attention of a long model converted from a BERT-family checkpoint (chosen by the screen in
    docs/long-context.md): a centred window of L − 1 tokens (±(L/2 − 1), L the source's positions, odd) in
    the lower half of the layers, :data:`DEFAULT_LONG_ATTENTION` above.

    With copied positions no token in a window sees two copies of one position, so the lower layers compute
    what the source computes on every window; at 4096 tokens from a 512-token MiniLM this kept 25.3 % dev MLM
    accuracy before any training against the source's 26.3 %, where Nyström in every layer fell to 10.5 %
    (docs/long-context.md). Below L tokens it differs from the source where tokens are more than L/2 − 1
    apart: give ``attention=`` for an exact start (``"softmax"``)."""
    if num_layers < 1 or source_length < 3:
        raise ValueError(
            f"long_attention needs a layer and a source of at least 3 positions, got {num_layers} layers and"
            f" {source_length} positions"
        )
    window = source_length - 1 if source_length % 2 == 0 else source_length - 2  # odd, below L
    local = {"name": "longformer", "window_size": window}
    low = num_layers // 2
    return [dict(local) for _ in range(low)] + [dict(DEFAULT_LONG_ATTENTION) for _ in range(num_layers - low)]


#: model types whose positions are not a learned absolute table: no rows to copy
_NOT_ABSOLUTE = {
    "roformer": "rotary", "deberta": "relative", "deberta-v2": "relative", "modernbert": "rotary",
    "t5": "relative", "funnel": "relative", "transfo-xl": "relative", "xlnet": "relative",
    "longformer": "already long (windowed)", "big_bird": "already long (block sparse)",
}  # fmt: skip
SUPPORTED_TYPES = (*BERT_FAMILY, "nystromformer", MODEL_TYPE)


def source_length(folder: str | Path) -> tuple[str, int]:
    """``(model_type, positions)`` of a checkpoint folder, read from its ``config.json`` alone.

    Positions are the inputs the source's table holds (RoBERTa: ``max_position_embeddings - 2``).
    Raises :class:`CheckpointError` naming the file for a folder that is not a model, an unsupported
    ``model_type`` and relative or rotary positions.
    """
    path = Path(folder) / "config.json"
    cfg = read_json(path)
    model_type = cfg.get("model_type")
    if model_type in _NOT_ABSOLUTE:
        raise CheckpointError(
            f"{path}: model_type {model_type!r} has {_NOT_ABSOLUTE[model_type]} positions, not a learned"
            f" absolute table to copy; to_long converts {list(SUPPORTED_TYPES)}"
        )
    if model_type not in SUPPORTED_TYPES:
        raise CheckpointError(
            f"{path}: model_type {model_type!r} is not one to_long converts; expected one of {list(SUPPORTED_TYPES)}"
        )
    kind = cfg.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise CheckpointError(
            f"{path}: position_embedding_type {kind!r} has no learned absolute table to copy (only 'absolute')"
        )
    length = cfg.get("max_position_embeddings", 512)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise CheckpointError(f"{path}: max_position_embeddings must be a positive int, got {length!r}")
    if model_type in BERT_FAMILY:
        length -= BERT_FAMILY[model_type][1]
    return model_type, length


def _load(
    folder: Path, model_type: str, attention: dict[str, Any] | list[dict[str, Any]] | None
) -> NystromformerPreTrainedModel:
    if model_type in BERT_FAMILY:
        load = from_roberta if BERT_FAMILY[model_type][1] else from_bert
        return load(folder, attention=attention)
    if model_type == "nystromformer":
        return from_hf(folder, attention=attention)  # None: HF's own attention regime and conv
    model = load_folder(folder)
    if attention is not None:
        model = transfer(model, type(model), model.config.replace(attention=attention))
    return model


def fresh_mlm_head(model: NystromformerForMaskedLM, *, seed: int) -> None:
    """Re-draw ``model.lm_head`` from ``seed`` alone (dense N(0, initializer_range), zero biases, unit
    LayerNorm; the decoder weight stays tied to the word embeddings): the same head whatever the encoder."""
    g = torch.Generator().manual_seed(seed)
    head = model.lm_head
    with torch.no_grad():
        w = torch.empty(head.dense.weight.shape).normal_(0.0, model.config.initializer_range, generator=g)
        head.dense.weight.copy_(w)
        head.dense.bias.zero_()
        head.norm.weight.fill_(1.0)
        head.norm.bias.zero_()
        head.decoder.bias.zero_()


def to_long(
    source: str | Path | NystromformerPreTrainedModel,
    *,
    max_position_embeddings: int,
    attention: str | dict[str, Any] | list[str | dict[str, Any]] | None = None,
    positions: str = "copy",
    alpha: float | None = None,
    seed: int = 0,
) -> NystromformerForMaskedLM:
    """A long (``max_position_embeddings`` = N) masked-LM of ours from a pretrained short model.

    ``source``: a folder of BERT, RoBERTa, XLM-R, CamemBERT, transformers' Nystromformer or ours, with or
    without an MLM head, or a model of ours. ``attention``: ``"softmax"`` (exact, SDPA), ``"nystrom"``
    or ``{"name": "nystrom", "num_landmarks": m, "conv_kernel_size": k, ...}``, or a list of one spec per
    layer; default :func:`long_attention` for BERT-family sources (a window in the lower half of the layers,
    Nyström above), the source's own otherwise.
    ``positions`` (:data:`~nystrom.model.positions.POSITION_SCHEMES`): how the L source rows become N —
    ``"copy"`` (row p = source row p mod L), ``"interpolate"`` or ``"hierarchical"`` (Su's decomposition
    with ``alpha``, 0.4 by default; rows below L unchanged); recorded in ``config.position_extension``.
    N must exceed the source's length. Returns the model in eval mode; ``save_pretrained`` it (or use ``nystrom convert
    long``, which also writes the tokenizer with ``model_max_length = N``).
    """
    if isinstance(max_position_embeddings, bool) or not isinstance(max_position_embeddings, int):
        raise TypeError(f"max_position_embeddings must be an int, got {max_position_embeddings!r}")
    given = isinstance(source, NystromformerPreTrainedModel)
    if given:
        length, where = source.config.max_position_embeddings, f"the {type(source).__name__} given"
    else:
        model_type, length = source_length(source)  # config.json only: nothing loaded before the check
        where = str(Path(source) / "config.json")
    if max_position_embeddings <= length:
        raise ValueError(
            f"max_position_embeddings ({max_position_embeddings}) must be above the source's {length}"
            f" positions ({where}): to_long extends a model"
        )
    check_scheme(positions, alpha, source_rows=length, rows=max_position_embeddings)  # before any weight
    if attention is not None:
        spec = normalize_attention(attention)
        layers = (
            source.config.num_hidden_layers
            if given
            else read_json(Path(source) / "config.json").get("num_hidden_layers")
        )
        if isinstance(spec, list) and len(spec) != layers:
            raise ValueError(
                f"attention is a list of {len(spec)} specs but the source has {layers} layers ({where}): give one"
                " spec per layer, or one for all"
            )
    if not given:
        if attention is None and model_type in BERT_FAMILY:
            attention = long_attention(read_json(Path(source) / "config.json")["num_hidden_layers"], length)
        model = _load(Path(source), model_type, attention)
    elif attention is not None:
        model = transfer(source, type(source), source.config.replace(attention=attention))
    else:
        model = source
    if not isinstance(model, NystromformerForMaskedLM):  # the encoder alone (or another head): a new MLM head
        mlm = transfer(model, NystromformerForMaskedLM, model.config)
        fresh_mlm_head(mlm, seed=seed)
        model = mlm
    elif type(model) is not NystromformerForMaskedLM:  # pre-training: keep its MLM head, drop SOP
        model = transfer(model, NystromformerForMaskedLM, model.config)
    model.resize_position_embeddings(max_position_embeddings, positions=positions, alpha=alpha)
    return model.eval()


__all__ = [
    "DEFAULT_LONG_ATTENTION",
    "fresh_mlm_head",
    "long_attention",
    "source_length",
    "to_long",
    "transfer",
]
