"""Typed model configuration with named presets and strict JSON round trip.

Legend: e hidden size, f FFN width, h heads, d head dim (= e / h), v vocabulary, n tokens.

``attention`` is a dict ``{"name": <registry key>, **options}``: the name selects a class in
``nystrom.attention.REGISTRY`` and the options must be keyword-only parameters of that class's constructor
(``dim``, ``heads``, ``dim_head``, ``qkv_bias`` and ``dropout`` come from the config itself).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACTIVATIONS = ("gelu", "gelu_new", "relu")
NORM_POSITIONS = ("post", "pre")
POOLINGS = ("cls", "mean", "mean_with_padding", "pooler")
LINEAR_INITS = ("normal", "torch")
# set by the model from the config, never by the attention options
_MANAGED_ATTENTION_ARGS = ("dim", "heads", "dim_head", "qkv_bias", "dropout")


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


def normalize_attention(attention: str | dict[str, Any]) -> dict[str, Any]:
    """Validate an attention spec (``"nystrom"`` or ``{"name": "nystrom", "num_landmarks": 32, ...}``)."""
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


@dataclass
class NystromformerConfig:
    """Everything needed to build an encoder and its heads. Build presets with :meth:`preset`."""

    vocab_size: int = 30000
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # 0 = no token-type table (LRA)
    pad_token_id: int | None = 0
    hidden_act: str = "gelu_new"  # "gelu" (erf, BERT), "gelu_new" (tanh approx., HF Nystromformer), "relu"
    norm_position: str = "post"  # "post" (BERT/HF) or "pre" (official LRA code)
    embedding_norm: bool = True  # LayerNorm after the embedding sum (BERT); LRA has none
    final_norm: bool = False  # LayerNorm after the last block (pre-LN models need it)
    layer_norm_eps: float = 1e-5
    dropout: float = 0.1  # embeddings, attention output and FFN output
    activation_dropout: float = 0.0  # inside the FFN after the activation (official LRA code: 0.1)
    qkv_bias: bool = True
    attention: dict[str, Any] = field(default_factory=lambda: {"name": "nystrom"})
    pooler: bool = False  # BERT's tanh pooler on the first token (needed by pre-training / "pooler" pooling)
    num_labels: int = 2
    pooling: str = "cls"  # "cls", "mean" (real tokens), "mean_with_padding" (official LRA), "pooler"
    classifier_hidden: int = 768  # classifier is Linear(e or 4e -> classifier_hidden)-ReLU-Linear(-> labels)
    initializer_range: float = 0.02
    # "normal": N(0, initializer_range) for Linear weights too (BERT, HF); "torch": PyTorch's default
    # Linear init (uniform ±1/√fan_in), as the official LRA code, whose Linears are left at their default
    linear_init: str = "normal"

    def __post_init__(self) -> None:
        self.attention = normalize_attention(self.attention)
        ints = {
            "vocab_size": 1,
            "hidden_size": 1,
            "num_hidden_layers": 0,
            "num_attention_heads": 1,
            "intermediate_size": 1,
            "max_position_embeddings": 1,
            "type_vocab_size": 0,
            "num_labels": 1,
            "classifier_hidden": 1,
        }
        for name, low in ints.items():
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or val < low:
                raise ValueError(f"config.{name} must be an int >= {low}, got {val!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"config.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads"
                f" ({self.num_attention_heads})"
            )
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"config.pad_token_id must be None or in [0, {self.vocab_size}), got {self.pad_token_id}"
            )
        for name, choices in (
            ("hidden_act", ACTIVATIONS),
            ("norm_position", NORM_POSITIONS),
            ("pooling", POOLINGS),
            ("linear_init", LINEAR_INITS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"config.{name} must be one of {choices}, got {getattr(self, name)!r}")
        for name in ("dropout", "activation_dropout"):
            val = getattr(self, name)
            if not isinstance(val, (int, float)) or not 0.0 <= val < 1.0:
                raise ValueError(f"config.{name} must be in [0, 1), got {val!r}")
        for name in ("layer_norm_eps", "initializer_range"):
            val = getattr(self, name)
            if not isinstance(val, (int, float)) or not (val > 0 and math.isfinite(val)):
                raise ValueError(f"config.{name} must be a positive float, got {val!r}")
        for name in ("embedding_norm", "final_norm", "qkv_bias", "pooler"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"config.{name} must be a bool, got {getattr(self, name)!r}")
        if self.pooling == "pooler" and not self.pooler:
            raise ValueError("config.pooling='pooler' needs config.pooler=True")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

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
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(
                f"preset override(s) {unknown} are not config fields; valid fields: {sorted(fields)}"
            )
        return cls(**{**PRESETS[name], **overrides})

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> NystromformerConfig:
        """Strict inverse of :meth:`to_dict`: unknown and missing keys are errors naming ``source``."""
        if not isinstance(data, dict):
            raise TypeError(f"{source}: expected a JSON object, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        data = {**ADDED_FIELDS, **data}  # files written before a field existed keep its old behaviour
        unknown = sorted(set(data) - set(names))
        missing = [n for n in names if n not in data]
        if unknown or missing:
            raise ValueError(f"{source}: unknown key(s) {unknown}, missing key(s) {missing}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> NystromformerConfig:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from err
        return cls.from_dict(data, source=str(path))


#: fields added after configs were first saved, with the value that reproduces the older behaviour
ADDED_FIELDS: dict[str, Any] = {"linear_init": "normal"}

_BERT_COMMON: dict[str, Any] = {
    "vocab_size": 30000,  # ALBERT SentencePiece vocabulary, as the released HF checkpoints
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "pad_token_id": 0,
    "hidden_act": "gelu_new",
    "norm_position": "post",
    "embedding_norm": True,
    "final_norm": False,
    "layer_norm_eps": 1e-5,
    "dropout": 0.1,
    "attention": {"name": "nystrom", "num_landmarks": 64, "conv_kernel_size": 65},
    "pooler": True,
    "pooling": "pooler",
}

PRESETS: dict[str, dict[str, Any]] = {
    "lra": {
        "vocab_size": 512,  # tasks override with their own vocabulary and length
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "type_vocab_size": 0,
        "pad_token_id": 0,
        "hidden_act": "gelu",
        "norm_position": "pre",
        "embedding_norm": False,
        "final_norm": True,
        "layer_norm_eps": 1e-5,
        "dropout": 0.1,
        "activation_dropout": 0.1,
        "attention": {"name": "nystrom", "num_landmarks": 64, "pinv_iterations": 6, "conv_kernel_size": 35},
        "pooler": False,
        "pooling": "mean",
        "classifier_hidden": 128,
        "linear_init": "torch",
    },
    "bert-small": {
        **_BERT_COMMON,
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "intermediate_size": 2048,
        "classifier_hidden": 512,
    },
    "bert-base": {
        **_BERT_COMMON,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "classifier_hidden": 768,
    },
}
