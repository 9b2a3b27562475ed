"""The one attention spec grammar of every ``nystrom`` command: ``NAME[-M][,key=value,...]``.

    nystrom                                  NystromAttention with its constructor's defaults
    nystrom-32                               ... with 32 landmarks
    nystrom-32,conv_kernel_size=none         ... and no conv skip
    nystrom,pinv=exact,pinv_iterations=0     keys are the attention module's constructor keyword names
    softmax | linear | linformer-256 | performer-256 | reformer-2 | longformer-257

``-M`` is a shorthand for the variant's main option (:data:`MAIN_KEY`: landmarks, projection length,
features, hashes, window). A key the spec does not set keeps the value a command's domain preset gives it
(LRA's official conv kernel 35, the paper's BERT-size 65) and otherwise the constructor's default, read
from its signature when the model is built (:func:`resolve`): no default is written twice.

Parsing imports neither torch nor the library (``nystrom --help`` and usage errors stay fast), so the
allowed keys are listed here, next to the parser; a test checks :data:`ATTENTION_KEYS` against the
constructors' keyword names so the two cannot drift.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

_POS, _NONNEG, _INT, _BOOL = "a positive int", "an int >= 0", "an int", "true or false"
_KERNEL, _ODD, _SEED = "an odd positive int or none", "an odd positive int", "an int or none"
_SCALE = "a number > 0 or none"
#: variant -> its constructor's keyword options (those the model does not set itself) -> allowed values
ATTENTION_KEYS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "nystrom": {
        "num_landmarks": _POS, "pinv_iterations": _NONNEG, "pinv_init": ("per_matrix", "original"),
        "pinv": ("iterative", "exact"), "conv_kernel_size": _KERNEL, "recompute": _BOOL, "causal": _BOOL,
        "scale": _SCALE,
    },
    "softmax": {"conv_kernel_size": _KERNEL, "block_size": _POS, "scale": _SCALE, "recompute": _BOOL},
    "linformer": {"max_seq_len": _POS, "proj_len": _POS},
    "linear": {"recompute": _BOOL},
    "longformer": {"window_size": _ODD},
    "performer": {"num_features": _POS, "seed": _INT},
    "reformer": {"n_hashes": _POS, "bucket_size": _POS, "seed": _SEED},
}  # fmt: skip
#: the option ``NAME-M`` sets; variants absent here take no number
MAIN_KEY: dict[str, str] = {
    "nystrom": "num_landmarks", "linformer": "proj_len", "performer": "num_features",
    "reformer": "n_hashes", "longformer": "window_size",
}  # fmt: skip
FORMS = (
    "NAME[-M][,key=value,...] with NAME one of " + ", ".join(ATTENTION_KEYS)
    + "; e.g. nystrom, nystrom-64, nystrom-32,conv_kernel_size=none,pinv=exact, softmax"
)  # fmt: skip
_HEAD = re.compile(r"^([a-z]+)(?:-([0-9]+))?$")


def _value(name: str, key: str, text: str) -> Any:
    """``text`` as the JSON scalar ``key`` takes (checked against its kind; None for ``none``)."""
    kind = ATTENTION_KEYS[name][key]
    if isinstance(kind, tuple):
        if text in kind:
            return text
        raise ValueError(f"{name}: {key} must be one of {', '.join(kind)}, got {text!r}")
    if kind == _BOOL and text in ("true", "false"):
        return text == "true"
    if text == "none" and kind in (_KERNEL, _SEED, _SCALE):
        return None
    if kind == _SCALE:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if math.isfinite(value) and value > 0:
            return value
        raise ValueError(f"{name}: {key} must be {kind}, got {text!r}")
    if kind != _BOOL and re.fullmatch(r"-?[0-9]+", text):
        value = int(text)
        low = {_POS: 1, _NONNEG: 0, _KERNEL: 1, _ODD: 1}.get(kind)
        if (low is None or value >= low) and (kind not in (_KERNEL, _ODD) or value % 2):
            return value
    raise ValueError(f"{name}: {key} must be {kind}, got {text!r}")


def parse(text: str) -> dict[str, Any]:
    """``"nystrom-32,pinv=exact"`` -> ``{"name": "nystrom", "num_landmarks": 32, "pinv": "exact"}``: only
    the options the spec sets (see :func:`resolve` for the rest). Raises ``ValueError`` naming the fault
    and the valid forms."""
    head, *pairs = text.split(",") if isinstance(text, str) else [""]
    match = _HEAD.match(head)
    if match is None or match.group(1) not in ATTENTION_KEYS:
        raise ValueError(f"unknown attention {text!r}; expected {FORMS}")
    name, number = match.group(1), match.group(2)
    spec: dict[str, Any] = {"name": name}
    if number is not None:
        if name not in MAIN_KEY:
            raise ValueError(f"{text!r}: {name} takes no -M number; write {name!r}; expected {FORMS}")
        spec[MAIN_KEY[name]] = _value(name, MAIN_KEY[name], number)
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or key not in ATTENTION_KEYS[name]:
            raise ValueError(
                f"{text!r}: {pair!r} is not key=value with a key of {name} ({', '.join(ATTENTION_KEYS[name])})"
            )
        if key in spec:
            raise ValueError(f"{text!r}: {key} is given twice")
        spec[key] = _value(name, key, raw)
    return spec


def _text(value: Any) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def format_spec(spec: dict[str, Any]) -> str:
    """The canonical text of a spec dict (the main option as ``-M``, then the other keys as written):
    ``parse(format_spec(s)) == s``. Used in output folder names and run records."""
    name, main = spec["name"], MAIN_KEY.get(spec["name"])
    head = f"{name}-{spec[main]}" if main in spec else name
    return ",".join([head, *(f"{k}={_text(v)}" for k, v in spec.items() if k not in ("name", main))])


def attention(text: str) -> str:
    """argparse ``type=`` of ``--attention``: the spec checked at parse time (a bad one is a usage error
    naming the option), kept as written."""
    try:
        parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    return text


def resolve(
    text: str, *, preset: dict[str, dict[str, Any]] | None = None, max_length: int | None = None
) -> dict[str, Any]:
    """The attention dict a model is built with: the spec's options, then the domain ``preset``'s for its
    variant (``{"nystrom": {"conv_kernel_size": 35}}``), and Linformer's ``max_seq_len = max_length``.
    Options left unset take the constructor's defaults when the module is built."""
    spec = parse(text)
    out = {**(preset or {}).get(spec["name"], {}), **spec}
    if spec["name"] == "linformer" and "max_seq_len" not in out:
        if max_length is None:
            raise ValueError(f"--attention {text}: Linformer needs the sequence length (max_seq_len)")
        out["max_seq_len"] = max_length
    return {"name": spec["name"], **{k: v for k, v in out.items() if k != "name"}}


def constructor_default(name: str, key: str) -> Any:
    """The default of ``key`` in the constructor of attention variant ``name`` (imports the library)."""
    import inspect

    from nystrom.attention import REGISTRY

    return inspect.signature(REGISTRY[name].__init__).parameters[key].default


def label(text: str) -> str:
    """``text`` in canonical form with the main option resolved (``nystrom`` -> ``nystrom-64``, the
    number being NystromAttention's default): output folder names say what ran."""
    spec = parse(text)
    main = MAIN_KEY.get(spec["name"])
    if main is not None and main not in spec:
        spec = {"name": spec["name"], main: constructor_default(spec["name"], main), **spec}
    return format_spec(spec)
