"""``attn_implementation="nystrom"`` for transformers models that use its attention interface.

Importing this module registers, under the name ``"nystrom"``:

- an attention function with ``transformers.AttentionInterface`` (BERT, RoBERTa, ViT and every model
  whose attention layer dispatches on ``config._attn_implementation``), and
- a mask function with ``transformers.masking_utils.AttentionMaskInterface``. Why both: transformers
  builds the attention mask per implementation, and for a name it has no mask function for it builds
  *none* (``_preprocess_mask_arguments`` exits early), so the attention would silently see padding.

Options come from ``config.nystrom_attention``: a dict of :func:`nystrom_attention`'s keyword options
(``num_landmarks``, ``pinv_iterations``, ``pinv``, ``pinv_init``, ``segments``), missing ones taking
that function's own defaults (64 landmarks, ...). ``mask`` and ``scale`` come from the model.

Packed documents (``DataCollatorWithFlattening``: several documents end to end in a row): every document
attends only to itself and gets what it gets alone. The documents come from what the model hands the
layers (:func:`~nystrom.ops.plan.packed_cu_seqlens`): ``cu_seq_lens_q``/``cu_seq_lens_k`` with
``max_length_q`` (``return_flash_attn_kwargs=True``), else ``seq_idx`` (``return_seq_idx=True``), else
``position_ids`` restarting at each document (the collator's default; BERT-family models pass them down).

Legend: b batch, h query heads, hk key/value heads, n tokens, d head dim, q query rows of a mask.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PretrainedConfig
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import (
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
    prepare_padding_mask,
    sdpa_mask,
)
from transformers.utils import logging

from nystrom.ops.nystrom import nystrom_attention
from nystrom.ops.plan import packed_cu_seqlens

NAME = "nystrom"

logger = logging.get_logger(__name__)

# Set by the model, never by config.nystrom_attention: the mask from attention_mask, the scale from the
# layer's own `scaling`, and causal is refused outright (Nyström landmarks are bidirectional).
_FROM_MODEL = ("mask", "scale", "causal")

_BIDIRECTIONAL_ERROR = (
    'attn_implementation="nystrom" is bidirectional attention: segment-means landmarks average over the '
    "whole sequence, so every output would see future tokens. It cannot serve a causal or decoder model "
    "(is_decoder / is_causal); use it for encoders (BERT, RoBERTa, ViT, ...)."
)

# Values of an additive float mask at or below this are "excluded": exp(-1e4) underflows to exactly 0 in
# every float dtype, so softmax gives them weight 0, as Nyström's key mask does (covers -inf,
# finfo.min as transformers' eager masks use, and the -10000 of older BERT code).
_ADDITIVE_MASKED = -1e4


# option -> default, read once from the signature (inspect follows functools.wraps): the defaults are
# written only there, and the check below runs in every layer's forward
_OPTIONS = {
    p: v.default
    for p, v in inspect.signature(nystrom_attention).parameters.items()
    if v.kind is inspect.Parameter.KEYWORD_ONLY and p not in _FROM_MODEL
}


def nystrom_options(config: PretrainedConfig | None) -> dict[str, Any]:
    """``config.nystrom_attention`` checked against :func:`nystrom_attention`'s keyword options.

    Returns the dict to pass on (missing keys are left out, so the function's own defaults apply).
    Raises ``TypeError`` if it is not a mapping and ``ValueError`` naming the valid keys on an unknown one.
    """
    options = getattr(config, "nystrom_attention", None)
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"config.nystrom_attention must be a dict of options, got {type(options).__name__}")
    bad = sorted(set(options) - set(_OPTIONS))
    if bad:
        defaults = ", ".join(f"{p}={d!r}" for p, d in _OPTIONS.items())
        raise ValueError(
            f"config.nystrom_attention has unknown option(s) {bad}; valid options (with defaults) are: "
            f"{defaults}. (mask and scale come from the model's attention_mask and scaling.)"
        )
    return dict(options)


def _refuse_causal(module: nn.Module | None, config: PretrainedConfig | None, is_causal: bool | None) -> None:
    """Raise for a decoder or causal layer. ``is_causal`` is the per-call override some models pass."""
    if bool(is_causal) or getattr(module, "is_causal", False) or getattr(config, "is_decoder", False):
        raise ValueError(_BIDIRECTIONAL_ERROR)


def nystrom_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable = bidirectional_mask_function,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """The mask that ``"nystrom"`` layers receive: (b, n) bool, True = real token, or ``None``.

    The plain bidirectional mask (the encoders' case) is returned as the 2-D key-padding mask
    itself, so no O(n²) mask is ever built. A causal mask raises. Any other pattern (a model's
    ``or_mask_function``/``and_mask_function``) is materialised as the 4-D bool mask SDPA would get;
    :func:`nystrom_attention_forward` then accepts it only if it is a pure key-padding mask.
    """
    _refuse_causal(None, kwargs.get("config"), None)
    if mask_function is causal_mask_function:
        raise ValueError(_BIDIRECTIONAL_ERROR)
    if mask_function is bidirectional_mask_function:
        # Pads a mask shorter than the keys with False, exactly as sdpa_mask does.
        return prepare_padding_mask(attention_mask, kv_length, kv_offset)
    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return sdpa_mask(
        batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, **kwargs
    )


def key_padding_mask(attention_mask: torch.Tensor | None, b: int, n: int) -> torch.Tensor | None:
    """(b, n) bool key mask (True = real token) from the mask a layer received, or ``None``.

    Accepts what :func:`nystrom_mask` returns, and 4-D masks (b|1, h|1, q, n), bool or additive float
    (0 = attend, ≤ -1e4 = excluded), as a user may pass one straight to the model. A 4-D mask is accepted
    only if every query row and head is the same key mask; anything else (causal, banded, a bias) raises
    ``ValueError``: the Nyström factors have no place for a per-query mask, and dropping it would be a
    silently different model. Checking costs O(b·q·n), paid only when a 4-D mask is given.
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        if attention_mask.dtype != torch.bool:
            raise TypeError(
                f"a 2-D attention mask must be bool (True = real token), got {attention_mask.dtype}"
            )
        return attention_mask
    if attention_mask.dim() != 4:
        raise ValueError(
            f"expected a (b, n) or (b, h, q, n) attention mask, got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype == torch.bool:
        keep = attention_mask
    else:
        keep = attention_mask == 0
        if not bool((keep | (attention_mask <= _ADDITIVE_MASKED)).all()):
            raise ValueError(
                'attn_implementation="nystrom" got an additive attention mask with values other than 0 and '
                "large negatives (a bias such as ALiBi or relative positions): Nyström attention cannot apply it"
            )
    row = keep[:, :1, :1, :]  # (b|1, 1, 1, n): the first head's first query row
    if keep.shape[-1] != n or not bool((keep == row).all()):
        raise ValueError(
            'attn_implementation="nystrom" supports key-padding masks only (the same key mask for every '
            f"query and head); got a 4-D mask {tuple(attention_mask.shape)} that is not one (causal, banded "
            "or arbitrary). Nyström attention would ignore it silently, so it is refused."
        )
    return row[:, 0, 0, :].expand(b, n)


def nystrom_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Nyström self-attention in transformers' attention-interface form.

    Args:
        module: the calling attention layer; ``module.config.nystrom_attention`` holds the options.
        query: (b, h, n, d); key, value: (b, hk, n, d), hk dividing h (grouped heads are repeated).
        attention_mask: what :func:`nystrom_mask` built, or a 4-D key-padding mask (see
            :func:`key_padding_mask`).
        dropout: attention-probability dropout. **Not applied**: it acts on the n×n probability
            matrix, which Nyström attention never forms (it is F·A⁺·B); dropping entries of a factor
            would be a different regulariser, not the same one. The model's other dropouts (hidden,
            embeddings) still apply, and in eval (dropout 0) the result is unaffected. A one-time
            warning says so when a model trains with it > 0.
        scaling: the score scale (passed as ``scale``).
        is_causal: a per-call override; True raises, as do ``module.is_causal`` and ``config.is_decoder``.
        **kwargs: transformers hands every attention function model-specific extras (position ids,
            ``output_attentions``, cache details, ...), so the interface needs this sink. Read from it:
            the packed documents' ``cu_seq_lens_q``, ``cu_seq_lens_k``, ``max_length_q``,
            ``max_length_k``, ``seq_idx`` and ``position_ids`` (see :func:`packed_documents`). The few
            that change the attention itself (``position_bias``, ``softcap``, ``sliding_window``,
            ``s_aux``) raise rather than be ignored; the rest are ignored.

    Returns:
        ``(out, None)``, out (b, n, h, d) contiguous, as ``sdpa_attention_forward`` returns; no
        attention weights (the n×n matrix is never formed).
    """
    config = getattr(module, "config", None)
    if config is None:
        raise TypeError(
            f'attn_implementation="nystrom" reads module.config; {type(module).__name__} has none'
        )
    _refuse_causal(module, config, is_causal)
    unsupported = sorted(
        k for k in ("position_bias", "softcap", "sliding_window", "s_aux") if kwargs.get(k) is not None
    )
    if unsupported:
        raise ValueError(f'attn_implementation="nystrom" cannot apply {unsupported} to the attention')
    if query.shape[2] != key.shape[2]:
        raise ValueError(
            f'attn_implementation="nystrom" is self-attention: got {query.shape[2]} queries and {key.shape[2]} keys'
        )
    options = nystrom_options(config)
    if dropout > 0 and module.training:
        logger.warning_once(
            'attn_implementation="nystrom" applies no attention-probability dropout (the n×n matrix is '
            "never formed); the model's other dropouts still apply."
        )
    if key.shape[1] != query.shape[1]:  # grouped-query attention: one k/v head serves h // hk query heads
        key = repeat_kv(key, query.shape[1] // key.shape[1])
        value = repeat_kv(value, query.shape[1] // value.shape[1])
    b, _, n, _ = query.shape
    mask = key_padding_mask(attention_mask, b, n)
    cu_seqlens, max_seqlen = packed_documents(attention_mask, mask, b, n, kwargs)
    out = nystrom_attention(
        query, key, value, mask=mask, scale=scaling, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, **options
    )  # (b, h, n, d)
    return out.transpose(1, 2).contiguous(), None  # (b, n, h, d)


_PACKING = ("position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")

# The last call's packed documents: (b, n, the received attention mask and the tensors of _PACKING, each as
# (weakref, version), and the ints), -> (cu_seqlens, max_seqlen). The model hands every layer the same
# objects, so deriving the documents (a host read for position ids or seq_idx) happens once per forward,
# not once per layer. Weak references: the cache keeps no batch alive (only the small offsets it holds), and
# a new object, or one edited in place since (its version moved), is derived anew. One entry suffices: the
# layers of a forward run in a row. (The documents' gather plan is still built per layer, from these offsets:
# no block spans the layers here, as a model's shared_plan does; a few small index ops per layer.)
_LAST: tuple[tuple, tuple[torch.Tensor | None, int | None]] | None = None


def _stamp(value: object) -> object:
    """What identifies ``value`` in the cache key: a tensor by (weakref, version), anything else as is."""
    if isinstance(value, torch.Tensor):
        return weakref.ref(value), value._version
    return value


def _same(stamp: object, value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return isinstance(stamp, tuple) and stamp[0]() is value and stamp[1] == value._version
    return not isinstance(stamp, tuple) and stamp == value


def packed_documents(
    received: torch.Tensor | None, mask: torch.Tensor | None, b: int, n: int, kwargs: Mapping[str, Any]
) -> tuple[torch.Tensor | None, int | None]:
    """The ``(cu_seqlens, max_seqlen)`` of a layer's call (:func:`~nystrom.ops.plan.packed_cu_seqlens` on
    the packing keywords of ``kwargs`` and the key mask ``mask``), derived once per forward: remembered
    for the last call's objects (``received``, the mask the layer got, and the keywords' tensors). Inference
    tensors keep no version counter, so calls with them are never remembered (their in-place edits could
    not be seen); nor under ``torch.compile``, where a traced call keeps no state: there ``position_ids``
    and ``seq_idx`` cost a graph break and a host read per layer, and ``cu_seq_lens_q`` none."""
    global _LAST
    given = {k: kwargs.get(k) for k in _PACKING}
    values = (b, n, received, *given.values())
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    remember = not torch.compiler.is_compiling() and not any(t.is_inference() for t in tensors)
    last = _LAST
    if remember and last is not None and all(_same(s, v) for s, v in zip(last[0], values)):
        return last[1]
    result = packed_cu_seqlens(b, n, attention_mask=mask, **given)
    if remember:
        _LAST = (tuple(_stamp(v) for v in values), result)
    return result


def register() -> None:
    """Register ``"nystrom"`` with transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(NAME, nystrom_attention_forward)
    AttentionMaskInterface.register(NAME, nystrom_mask)


register()
