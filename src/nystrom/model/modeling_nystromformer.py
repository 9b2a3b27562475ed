"""Embeddings, encoder blocks, :class:`NystromformerPreTrainedModel` and the bare :class:`NystromformerModel`.

Legend: b batch, n tokens, e hidden size, f FFN width, v vocabulary, p position-table rows, h heads.

Blocks are post-LN (BERT, HF checkpoints: ``x = LN(x + attn(x))``) or pre-LN (official LRA code:
``x = x + attn(LN(x))``, then a final LayerNorm). Masks: callers pass transformers' ``attention_mask``
(b, n) of 0/1 or bool (1/True = real token); it becomes the bool ``mask`` the attention takes.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling

from nystrom.functional.attention import nystrom_factors
from nystrom.functional.dropout import Dropout
from nystrom.model.configuration_nystromformer import NystromformerConfig

#: ``output_attentions=True`` materialises (b, h, n, n) per layer; longer inputs raise instead
MAX_ATTENTION_TOKENS = 4096


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_new":  # tanh approximation, HF's "gelu_new"
        return F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu(x)
    raise ValueError(f"unknown activation {name!r}")


def to_key_padding_mask(attention_mask: torch.Tensor | None, b: int, n: int, *, name: str = "attention_mask"):
    """transformers' mask (b, n) of 0/1 (any int/float dtype) or bool -> bool (b, n), True = real token."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(
            f"{name} must be a (batch, tokens) tensor of 0/1 or bool, got {type(attention_mask).__name__}"
        )
    if tuple(attention_mask.shape) != (b, n):
        raise ValueError(
            f"{name} must have shape (batch, tokens) = ({b}, {n}), got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype == torch.bool:
        return attention_mask
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError(f"{name} must hold only 0 (padding) and 1 (real token), or be a bool tensor")
    return attention_mask != 0


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over real tokens: ``x`` (b, n, e), mask (b, n) bool or None -> (b, e)."""
    if mask is None:
        return x.mean(1)
    w = mask.to(x.dtype).unsqueeze(-1)  # (b, n, 1)
    return (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # (b, e)


def _check_ids(name: str, ids: torch.Tensor, shape: tuple[int, ...] | None, limit: int) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"{name} must be an int64/int32 tensor, got {getattr(ids, 'dtype', type(ids).__name__)}"
        )
    if shape is not None and tuple(ids.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
        raise ValueError(
            f"{name} must lie in [0, {limit}), got values in [{int(ids.min())}, {int(ids.max())}]"
        )


class Embeddings(nn.Module):
    """word (or ``inputs_embeds``) + learned position (+ token type) -> (LayerNorm) -> dropout: (b, n, e)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        e = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.offset = config.position_offset  # rows before position 0 (HF Nystromformer: 2)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings + self.offset, e)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size else None
        )
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps) if config.embedding_norm else None
        self.dropout = Dropout(config.dropout)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, n, _ = inputs_embeds.shape
        p = self.position_embeddings.num_embeddings - self.offset
        if position_ids is None:
            if n > p:
                raise ValueError(
                    f"input has {n} tokens but the position table holds {p} (config.max_position_embeddings);"
                    f" extend it with model.resize_position_embeddings({n}), which tiles the learned rows"
                )
            x = inputs_embeds + self.position_embeddings.weight[self.offset : self.offset + n]  # (b, n, e)
        else:
            _check_ids("position_ids", position_ids, None, p)
            x = inputs_embeds + self.position_embeddings(position_ids.expand(b, n) + self.offset)  # (b, n, e)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                x = x + self.token_type_embeddings.weight[0]
            else:
                _check_ids("token_type_ids", token_type_ids, (b, n), self.token_type_embeddings.num_embeddings)
                x = x + self.token_type_embeddings(token_type_ids)  # (b, n, e)
        elif token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError(
                "token_type_ids given but the model has no token-type table (config.type_vocab_size=0)"
            )
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class FeedForward(nn.Module):
    """Linear(e -> f) -> act -> dropout -> Linear(f -> e) -> dropout: (b, n, e) -> (b, n, e)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        self.act = config.hidden_act
        self.dense_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.dense_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.inner_dropout = Dropout(config.activation_dropout)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.inner_dropout(activation(self.act, self.dense_in(x)))  # (b, n, f)
        return self.dropout(self.dense_out(hidden))  # (b, n, e)


def build_attention(config: NystromformerConfig) -> nn.Module:
    from nystrom.attention import REGISTRY

    options = {k: v for k, v in config.attention.items() if k != "name"}
    return REGISTRY[config.attention["name"]](
        config.hidden_size,
        heads=config.num_attention_heads,
        dim_head=config.head_dim,
        qkv_bias=config.qkv_bias,
        dropout=config.dropout,
        **options,
    )


def attention_matrix(attn: nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The (b, h, n, n) attention weights the module applies to ``x`` (b, n, e): F·A⁺·B for Nyström,
    softmax(QKᵀ/√d) for softmax attention (the conv skip is not part of it). For inspection only."""
    n = x.shape[1]
    if n > MAX_ATTENTION_TOKENS:
        raise ValueError(
            f"output_attentions=True holds a (batch, heads, {n}, {n}) matrix per layer; it is limited to"
            f" n <= {MAX_ATTENTION_TOKENS} tokens (nystrom.model.MAX_ATTENTION_TOKENS). Use"
            " nystrom.functional.nystrom_factors for the O(n·m) factors of longer inputs"
        )
    name = getattr(attn, "name", "")
    if name not in ("nystrom", "softmax"):
        raise ValueError(f"output_attentions is available for 'nystrom' and 'softmax' attention, not {name!r}")
    h, d = attn.heads, attn.dim_head
    q, k, _ = attn.qkv(x).unflatten(-1, (3, h, d)).permute(2, 0, 3, 1, 4)  # each (b, h, n, d)
    if name == "softmax":
        s = (q @ k.mT).float() / math.sqrt(d)  # (b, h, n, n)
        if mask is not None:
            s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
        return torch.softmax(s, -1).to(x.dtype)
    f, z, b = nystrom_factors(
        q, k, num_landmarks=attn.num_landmarks, key_padding_mask=mask,
        pinv_iterations=attn.pinv_iterations, pinv=attn.pinv, pinv_init=attn.pinv_init,
    )  # fmt: skip
    return (f @ z @ b).to(x.dtype)  # (b, h, n, n)


class EncoderLayer(GradientCheckpointingLayer):
    """One block: ``x`` (b, n, e), ``mask`` (b, n) bool or None -> (b, n, e) and, when asked, (b, h, n, n)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attention = build_attention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a_in = self.attention_norm(x) if self.pre_norm else x
        probs = attention_matrix(self.attention, a_in, mask) if output_attentions else None
        if self.pre_norm:
            x = x + self.attention(a_in, mask)  # (b, n, e)
            return x + self.ffn(self.ffn_norm(x)), probs
        x = self.attention_norm(x + self.attention(x, mask))  # (b, n, e)
        return self.ffn_norm(x + self.ffn(x)), probs


class Encoder(nn.Module):
    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))
        self.final_norm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.final_norm else None
        )

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, *, output_attentions: bool, output_hidden_states: bool
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...] | None]:
        """(b, n, e) -> last hidden state, the inputs of every layer + the output, every layer's weights."""
        states: list[torch.Tensor] = []
        weights: list[torch.Tensor] = []
        for layer in self.layers:
            states.append(x)
            x, probs = layer(x, mask, output_attentions)  # (b, n, e)
            if probs is not None:
                weights.append(probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
        states.append(x)
        return x, tuple(states) if output_hidden_states else None, tuple(weights) if output_attentions else None


class NystromformerPreTrainedModel(PreTrainedModel):
    """Shared base of the encoder and every head: weight init, position-table resizing and ``to_hf``."""

    config_class = NystromformerConfig
    config: NystromformerConfig
    base_model_prefix = "nystromformer"
    supports_gradient_checkpointing = True
    _no_split_modules: ClassVar[list[str]] = ["EncoderLayer"]

    def _init_weights(self, module: nn.Module) -> None:
        """N(0, initializer_range) for Embedding (and, with ``linear_init="normal"``, Linear) weights, zero
        biases, unit LayerNorms; ``linear_init="torch"`` gives Linears PyTorch's default init, and the conv
        skip always has PyTorch's default (kaiming-uniform) init."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear) and self.config.linear_init == "normal":
            init.normal_(module.weight, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (nn.Linear, nn.Conv2d)):  # torch's reset_parameters, flag-aware
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            if module.bias is not None:
                bound = 1 / math.sqrt(module.weight[0].numel())
                init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    def resize_position_embeddings(self, new_max: int) -> None:
        """Make the position table ``new_max`` rows: row i becomes old row ``i % old_rows`` (the official
        code's tiling for longer inputs), so a longer input sees the learned rows repeated; shrinking keeps
        the first ``new_max`` rows. Updates ``config.max_position_embeddings``."""
        if not isinstance(new_max, int) or isinstance(new_max, bool) or new_max < 1:
            raise ValueError(f"new_max must be a positive int, got {new_max!r}")
        embeddings = self.base_model.embeddings
        old = embeddings.position_embeddings.weight.data  # (offset + p, e)
        off = embeddings.offset
        index = torch.cat([torch.arange(off), off + torch.arange(new_max) % (old.shape[0] - off)])
        new = nn.Embedding(off + new_max, old.shape[1], device=old.device, dtype=old.dtype)
        with torch.no_grad():
            new.weight.copy_(old[index.to(old.device)])  # (offset + new_max, e)
        embeddings.position_embeddings = new
        self.config.max_position_embeddings = new_max

    def to_hf(self, path, *, segment_means_seq_len: int | None = None) -> None:
        """Write a transformers ``NystromformerModel``/``…For*`` folder (see :func:`nystrom.model.to_hf`)."""
        from nystrom.model.interop_hf import to_hf

        to_hf(self, path, segment_means_seq_len=segment_means_seq_len)


class NystromformerModel(NystromformerPreTrainedModel):
    """Bare encoder: ``input_ids`` (b, n) -> ``last_hidden_state`` (b, n, e) (+ ``pooler_output`` (b, e))."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.pooler else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def encode(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        *,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> tuple[BaseModelOutputWithPooling, torch.Tensor | None]:
        """The model output and the bool padding mask (b, n) (None = no padding), for the heads."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids (batch, tokens) and inputs_embeds (batch, tokens, e)")
        if input_ids is not None:
            if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
                shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
                raise ValueError(f"input_ids must have shape (batch, tokens), got {shape}")
            _check_ids("input_ids", input_ids, None, self.config.vocab_size)
            inputs_embeds = self.embeddings.word_embeddings(input_ids)  # (b, n, e)
        elif inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.config.hidden_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, tokens, {self.config.hidden_size}),"
                f" got {tuple(inputs_embeds.shape)}"
            )
        b, n, _ = inputs_embeds.shape
        mask = to_key_padding_mask(attention_mask, b, n)
        x = self.embeddings(inputs_embeds, token_type_ids, position_ids)  # (b, n, e)
        hidden, states, weights = self.encoder(
            x,
            mask,
            output_attentions=bool(self.config.output_attentions if output_attentions is None else output_attentions),
            output_hidden_states=bool(
                self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
            ),
        )
        pooled = torch.tanh(self.pooler(hidden[:, 0])) if self.pooler is not None else None  # (b, e)
        out = BaseModelOutputWithPooling(
            last_hidden_state=hidden, pooler_output=pooled, hidden_states=states, attentions=weights
        )
        return out, mask

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> BaseModelOutputWithPooling | tuple:
        """``input_ids`` (b, n) or ``inputs_embeds`` (b, n, e); ``attention_mask`` (b, n), 1 = real token."""
        out, _ = self.encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )  # fmt: skip
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()
