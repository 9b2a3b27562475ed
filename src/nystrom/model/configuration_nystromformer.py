"""``NystromformerConfig``: a ``transformers.PreTrainedConfig`` with validation and named presets.

Legend: e hidden size, f FFN width, h heads, d head dim (= e / h), v vocabulary, n tokens.

``model_type`` is ``"nystrom-nystromformer"`` (``"nystromformer"`` is transformers' own class, which
:func:`nystrom.model.from_hf` / :func:`nystrom.model.to_hf` convert). ``attention`` is a dict
``{"name": <registry key>, **options}``: the name selects a class in ``nystrom.attention.REGISTRY`` and the
options must be keyword-only parameters of that class's constructor (``dim``, ``heads``, ``dim_head``,
``qkv_bias`` and ``dropout`` come from the config itself). ``attention`` may also be a list of such dicts, one
per layer. ``position_extension`` records how :func:`nystrom.model.to_long` grew the position table.
"""

from __future__ import annotations

import inspect
import json
import math
from typing import Any, ClassVar

from transformers import PreTrainedConfig

from nystrom.model.positions import check_record
from nystrom.model.presets import PRESETS

MODEL_TYPE = "nystrom-nystromformer"
ACTIVATIONS = ("gelu", "gelu_new", "relu")
NORM_POSITIONS = ("post", "pre")
POOLINGS = ("cls", "mean", "mean_with_padding", "pooler")
LINEAR_INITS = ("normal", "torch")
# set by the model from the config, never by the attention options
_MANAGED_ATTENTION_ARGS = ("dim", "heads", "dim_head", "qkv_bias", "dropout")
LEGACY_MESSAGE = (
    '{source} is an old nystrom checkpoint ("format": "nystrom", written before the models became'
    " transformers models), which transformers cannot read. Convert it once with"
    " `python -c \"import nystrom; nystrom.convert_legacy_checkpoint('OLD_FOLDER', 'NEW_FOLDER')\"`;"
    " the new folder loads with AutoModel*.from_pretrained."
)


def _registry() -> dict[str, type]:
    from nystrom.attention import REGISTRY

    return REGISTRY


def attention_option_names(name: str) -> tuple[str, ...]:
    """The options (constructor keyword-only parameters) the attention variant ``name`` accepts."""
    registry = _registry()
    if name not in registry:
        raise ValueError(f"attention name must be one of {sorted(registry)}, got {name!r}")
    params = inspect.signature(registry[name].__init__).parameters.values()
    return tuple(
        p.name
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _MANAGED_ATTENTION_ARGS
    )


def resolved_attention(attention: dict[str, Any]) -> dict[str, Any]:
    """``attention`` with every option the variant's constructor would default filled in."""
    params = inspect.signature(_registry()[attention["name"]].__init__).parameters
    names = attention_option_names(attention["name"])
    return {"name": attention["name"], **{n: params[n].default for n in names}, **attention}


def normalize_attention(
    attention: str | dict[str, Any] | list[str | dict[str, Any]],
) -> dict[str, Any] | list[dict[str, Any]]:
    """Validate an attention spec (``"nystrom"`` or ``{"name": "nystrom", "num_landmarks": 32, ...}``), or a
    list of them, one per layer (e.g. a local window below and Nyström above)."""
    if isinstance(attention, (list, tuple)):
        if not attention:
            raise ValueError("attention as a list needs one spec per layer, got an empty list")
        return [_normalize_one(a) for a in attention]
    return _normalize_one(attention)


def _normalize_one(attention: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(attention, str):
        attention = {"name": attention}
    if not isinstance(attention, dict) or not isinstance(attention.get("name"), str):
        raise ValueError(
            "attention must be a registry name or a dict {'name': <registry name>, <option>: <value>, ...},"
            f" got {attention!r}"
        )
    allowed = attention_option_names(attention["name"])
    unknown = sorted(set(attention) - {"name"} - set(allowed))
    if unknown:
        raise ValueError(
            f"attention {attention['name']!r} does not accept option(s) {unknown}; its options are {list(allowed)}"
        )
    for key, val in attention.items():
        if not isinstance(val, (str, int, float, bool, type(None))):
            raise TypeError(f"attention option {key!r} must be a JSON scalar, got {type(val).__name__}")
    return dict(attention)


def _is_int(val: Any) -> bool:
    return isinstance(val, int) and not isinstance(val, bool)


def _is_real(val: Any) -> bool:
    return isinstance(val, (int, float)) and not isinstance(val, bool) and math.isfinite(val)


class NystromformerConfig(PreTrainedConfig):
    """Everything needed to build an encoder and its heads; build presets with :meth:`preset`.

    Takes transformers' standard encoder keywords (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``intermediate_size``, ``max_position_embeddings``, ``type_vocab_size``,
    ``hidden_act``, ``hidden_dropout_prob`` (= ``dropout``), ``layer_norm_eps``, ``initializer_range``,
    ``pad_token_id``, ``num_labels``/``id2label``/``label2id``, ``problem_type``) and these of ours:

    - ``norm_position``: ``"post"`` (BERT/HF) or ``"pre"`` (official LRA code);
    - ``embedding_norm`` (LayerNorm after the embedding sum), ``final_norm`` (after the last block);
    - ``activation_dropout`` (inside the FFN), ``qkv_bias``, ``attention`` (see the module docstring);
    - ``pooler`` (BERT's tanh pooler), ``pooling`` (``"cls"``, ``"mean"`` over real tokens,
      ``"mean_with_padding"`` as the official LRA code, ``"pooler"``);
    - ``classifier_hidden`` (None = e), ``classifier_act`` and ``classifier_dropout`` (None = ``dropout``)
      of the sequence classifier Linear(e -> k) -> act -> Linear(k -> c);
    - ``linear_init``: ``"normal"`` (N(0, initializer_range), BERT) or ``"torch"`` (PyTorch's default, as
      the official LRA code leaves its Linears);
    - ``position_offset``: table rows before position 0 (2 in models from transformers' Nystromformer,
      whose position ids start at 2); ``hf_config``: that model's own config fields, so ``to_hf`` gives
      them back unchanged.

    Every value is validated on construction (an int field refuses ``True``); errors name the field.
    """

    model_type = MODEL_TYPE
    attribute_map: ClassVar[dict[str, str]] = {"hidden_dropout_prob": "dropout"}

    vocab_size: int = 30000
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # 0 = no token-type table (LRA)
    pad_token_id: int | None = 0
    hidden_act: str = "gelu_new"  # "gelu" (erf, BERT), "gelu_new" (tanh approx., HF Nystromformer), "relu"
    norm_position: str = "post"
    embedding_norm: bool = True
    final_norm: bool = False
    layer_norm_eps: float = 1e-5
    dropout: float = 0.1  # embeddings, attention output and FFN output
    activation_dropout: float = 0.0
    qkv_bias: bool = True
    attention: dict[str, Any] | list[dict[str, Any]] | str | None = None  # None = {"name": "nystrom"}
    pooler: bool = False
    pooling: str = "cls"
    classifier_hidden: int | None = None
    classifier_act: str = "relu"
    classifier_dropout: float | None = None
    initializer_range: float = 0.02
    linear_init: str = "normal"
    position_offset: int = 0  # rows before position 0 in the table (HF Nystromformer: 2)
    hf_config: dict[str, Any] | None = None  # transformers' NystromformerConfig fields kept for to_hf
    position_extension: dict[str, Any] | None = None  # how to_long grew the position table (positions.py)
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs: Any) -> None:
        if kwargs.get("format") == "nystrom":
            raise ValueError(LEGACY_MESSAGE.format(source="this config.json"))
        if kwargs.get("model_type") not in (None, MODEL_TYPE):
            cli = "`nystrom convert to-nystrom --init-from FOLDER --out OUT`"
            how = {"nystromformer": f"convert it with nystrom.from_hf(folder) (or {cli})",
                   "bert": f"convert it with nystrom.from_bert(folder) (or {cli})"}  # fmt: skip
            raise ValueError(
                f"this config.json has model_type {kwargs['model_type']!r}, not {MODEL_TYPE!r}; "
                + how.get(kwargs["model_type"], "nystrom converts only 'bert' and 'nystromformer' folders")
            )
        probs = kwargs.pop("attention_probs_dropout_prob", None)
        if probs not in (None, 0, 0.0):
            raise ValueError(
                "attention_probs_dropout_prob is not supported: the attention has no dropout on its"
                " probabilities (config.dropout applies to its output); pass hidden_dropout_prob/dropout"
            )
        super().__post_init__(**kwargs)
        self.attention = normalize_attention(
            {"name": "nystrom"} if self.attention is None else self.attention
        )
        if self.classifier_hidden is None:
            self.classifier_hidden = self.hidden_size
        self._check()

    def _check(self) -> None:
        lows = {"vocab_size": 1, "hidden_size": 1, "num_hidden_layers": 0, "num_attention_heads": 1,
                "intermediate_size": 1, "max_position_embeddings": 1, "type_vocab_size": 0,
                "num_labels": 1, "classifier_hidden": 1, "position_offset": 0}  # fmt: skip
        for name, low in lows.items():
            val = getattr(self, name)
            if not _is_int(val) or val < low:
                raise ValueError(f"config.{name} must be an int >= {low}, got {val!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"config.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads"
                f" ({self.num_attention_heads})"
            )
        pad = self.pad_token_id
        if pad is not None and not (_is_int(pad) and 0 <= pad < self.vocab_size):
            raise ValueError(
                f"config.pad_token_id must be None or an int in [0, {self.vocab_size}), got {pad!r}"
            )
        for name, choices in (("hidden_act", ACTIVATIONS), ("classifier_act", ACTIVATIONS),
                              ("norm_position", NORM_POSITIONS), ("pooling", POOLINGS),
                              ("linear_init", LINEAR_INITS)):  # fmt: skip
            if getattr(self, name) not in choices:
                raise ValueError(f"config.{name} must be one of {choices}, got {getattr(self, name)!r}")
        for name in ("dropout", "activation_dropout", "classifier_dropout"):
            val = getattr(self, name)
            if not (val is None and name == "classifier_dropout") and not (
                _is_real(val) and 0.0 <= val < 1.0
            ):
                raise ValueError(f"config.{name} must be a float in [0, 1), got {val!r}")
        for name in ("layer_norm_eps", "initializer_range"):
            val = getattr(self, name)
            if not (_is_real(val) and val > 0):
                raise ValueError(f"config.{name} must be a positive float, got {val!r}")
        for name in ("embedding_norm", "final_norm", "qkv_bias", "pooler", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"config.{name} must be a bool, got {getattr(self, name)!r}")
        if self.hf_config is not None and not isinstance(self.hf_config, dict):
            raise TypeError(f"config.hf_config must be None or a dict, got {type(self.hf_config).__name__}")
        if isinstance(self.attention, list) and len(self.attention) != self.num_hidden_layers:
            raise ValueError(
                f"config.attention is a list of {len(self.attention)} specs but the model has"
                f" {self.num_hidden_layers} layers (num_hidden_layers): give one spec per layer, or one dict for all"
            )
        check_record(self.position_extension)
        if self.pooling == "pooler" and not self.pooler:
            raise ValueError("config.pooling='pooler' needs config.pooler=True")

    def validate(self) -> None:
        """Re-check every field (transformers calls this before saving)."""
        self._check()

    def layer_attention(self, index: int) -> dict[str, Any]:
        """The attention spec of layer ``index`` (the one dict, or the list's entry)."""
        return self.attention[index] if isinstance(self.attention, list) else self.attention

    @property
    def per_layer_attention(self) -> bool:
        """Whether ``attention`` is a list (one spec per layer) rather than one spec for every layer."""
        return isinstance(self.attention, list)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def classifier_dropout_p(self) -> float:
        """The classifier's dropout: ``classifier_dropout``, or ``dropout`` when that is None (as BERT)."""
        return self.dropout if self.classifier_dropout is None else self.classifier_dropout

    @classmethod
    def field_names(cls) -> set[str]:
        """Every keyword the constructor takes as a field (ours, transformers' and the aliases)."""
        return set(cls.__dataclass_fields__) | {"num_labels", *cls.attribute_map}

    def replace(self, **changes: Any) -> NystromformerConfig:
        """A validated copy with ``changes`` applied (``attention`` may be a name or a dict)."""
        unknown = sorted(set(changes) - self.field_names())
        if unknown:
            raise ValueError(f"{unknown} are not config fields")
        base = self.to_dict()
        if "num_labels" in changes and "id2label" not in changes:  # a new label count drops the old names
            base.pop("id2label", None)
            base.pop("label2id", None)
        return type(self).from_dict({**base, **changes})

    def definition(self) -> dict[str, Any]:
        """The JSON-ready fields that define the model (no transformers bookkeeping such as its version),
        for run records that must compare equal across sessions."""
        d = self.to_dict()
        for key in ("transformers_version", "_name_or_path", "architectures", "dtype", "output_attentions",
                    "output_hidden_states", "return_dict"):  # fmt: skip
            d.pop(key, None)
        return json.loads(json.dumps(d, sort_keys=True))

    # ------------------------------------------------------------------ presets
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> NystromformerConfig:
        """A named configuration, with validated field overrides.

        ``"lra"``: the official LRA model (2 pre-LN layers, e=64, f=128, 2 heads, final LayerNorm, mean
        pooling, classifier 64→128→classes, Nyström m=64 with a kernel-35 conv skip);
        ``"bert-small"`` (4 layers, e=512, 8 heads, f=2048) and ``"bert-base"`` (12, 768, 12, 3072): post-LN
        like BERT and the HF checkpoints (gelu_new, eps 1e-5, Nyström m=64, conv kernel 65, pooler).
        ``attention`` may be given as a name or a dict; other overrides must be config field names.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        unknown = sorted(set(overrides) - cls.field_names())
        if unknown:
            raise ValueError(f"preset override(s) {unknown} are not config fields")
        return cls(**{**PRESETS[name], **overrides})
