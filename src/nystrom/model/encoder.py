"""Embeddings, encoder blocks and the bare :class:`NystromformerModel`.

Legend: b batch, n tokens, e hidden size, f FFN width, v vocabulary, p position-table rows.

Blocks are post-LN (BERT, HF checkpoints: ``x = LN(x + attn(x))``) or pre-LN (official LRA code:
``x = x + attn(LN(x))``, then a final LayerNorm). Masks: callers pass an HF-style ``attention_mask``
(b, n) of 0/1 or bool (1/True = real token); it becomes the bool ``key_padding_mask`` the attention takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nystrom.functional.checks import value_checks_enabled
from nystrom.functional.dropout import Dropout
from nystrom.model.config import NystromformerConfig


@dataclass
class NystromformerOutput:
    """What every model returns. ``last_hidden_state`` (b, n, e) always; ``logits`` for heads
    ((b, n, v) MLM, (b, c) classification); ``loss`` when labels are given; ``pooler_output`` (b, e) when
    the model has a pooler; ``sop_logits`` (b, 2) for pre-training; ``last_hidden_state_2`` (b, n2, e)
    for the second document of the dual model."""

    last_hidden_state: torch.Tensor
    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    sop_logits: torch.Tensor | None = None
    last_hidden_state_2: torch.Tensor | None = None


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_new":  # tanh approximation, HF's "gelu_new"
        return F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu(x)
    raise ValueError(f"unknown activation {name!r}")


def to_key_padding_mask(attention_mask: torch.Tensor | None, b: int, n: int, *, name: str = "attention_mask"):
    """HF-style mask (b, n) of 0/1 (any int/float dtype) or bool -> bool (b, n), True = real token."""
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
    if value_checks_enabled(attention_mask) and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError(f"{name} must hold only 0 (padding) and 1 (real token), or be a bool tensor")
    return attention_mask != 0


def masked_mean(x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over real tokens: ``x`` (b, n, e), mask (b, n) bool or None -> (b, e)."""
    if key_padding_mask is None:
        return x.mean(1)
    w = key_padding_mask.to(x.dtype).unsqueeze(-1)  # (b, n, 1)
    return (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # (b, e)


class Embeddings(nn.Module):
    """word + learned position (+ token type) -> (LayerNorm) -> dropout: ids (b, n) -> (b, n, e)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        e = config.hidden_size
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, e)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size else None
        )
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps) if config.embedding_norm else None
        self.dropout = Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        b, n = input_ids.shape
        p = self.position_embeddings.num_embeddings
        if n > p:
            raise ValueError(
                f"input has {n} tokens but the position table holds {p} (config.max_position_embeddings);"
                f" extend it with model.resize_position_embeddings({n}), which tiles the learned rows"
            )
        x = self.word_embeddings(input_ids) + self.position_embeddings.weight[:n]  # (b, n, e)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                x = x + self.token_type_embeddings.weight[0]
            else:
                _check_ids(
                    "token_type_ids", token_type_ids, (b, n), self.token_type_embeddings.num_embeddings
                )
                x = x + self.token_type_embeddings(token_type_ids)  # (b, n, e)
        elif token_type_ids is not None:
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
    cls = REGISTRY[config.attention["name"]]
    return cls(
        config.hidden_size,
        heads=config.num_attention_heads,
        dim_head=config.head_dim,
        qkv_bias=config.qkv_bias,
        dropout=config.dropout,
        **options,
    )


class EncoderLayer(nn.Module):
    """One block: ``x`` (b, n, e), ``key_padding_mask`` (b, n) bool or None -> (b, n, e)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attention = build_attention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attention(self.attention_norm(x), mask=key_padding_mask)  # (b, n, e)
            return x + self.ffn(self.ffn_norm(x))
        x = self.attention_norm(x + self.attention(x, mask=key_padding_mask))  # (b, n, e)
        return self.ffn_norm(x + self.ffn(x))


class Encoder(nn.Module):
    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))
        self.final_norm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.final_norm else None
        )

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, key_padding_mask)  # (b, n, e)
        return self.final_norm(x) if self.final_norm is not None else x


def _check_ids(name: str, ids: torch.Tensor, shape: tuple[int, ...] | None, limit: int) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"{name} must be an int64/int32 tensor, got {getattr(ids, 'dtype', type(ids).__name__)}"
        )
    if shape is not None and tuple(ids.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(ids.shape)}")
    if value_checks_enabled(ids) and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
        raise ValueError(
            f"{name} must lie in [0, {limit}), got values in [{int(ids.min())}, {int(ids.max())}]"
        )


class NystromformerPreTrainedModel(nn.Module):
    """Shared base: config, weight init, position-table resizing, native save/load and ``to_hf``."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        if not isinstance(config, NystromformerConfig):
            raise TypeError(f"config must be a NystromformerConfig, got {type(config).__name__}")
        self.config = config

    @property
    def base_model(self) -> NystromformerModel:
        return self if isinstance(self, NystromformerModel) else self.nystromformer

    def init_weights(self) -> None:
        """N(0, initializer_range) for Embedding (and, with ``linear_init="normal"``, Linear) weights, zero
        biases, unit LayerNorms; ``linear_init="torch"`` leaves Linears at PyTorch's default init."""
        std = self.config.initializer_range
        linears = nn.Linear if self.config.linear_init == "normal" else ()
        for module in self.modules():
            if isinstance(module, (linears, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
                if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def resize_position_embeddings(self, new_max: int) -> None:
        """Make the position table ``new_max`` rows: row i becomes old row ``i % old_rows`` (the official
        code's tiling for longer inputs), so a longer input sees the learned rows repeated; shrinking keeps
        the first ``new_max`` rows. Updates ``config.max_position_embeddings``."""
        if not isinstance(new_max, int) or isinstance(new_max, bool) or new_max < 1:
            raise ValueError(f"new_max must be a positive int, got {new_max!r}")
        emb = self.base_model.embeddings.position_embeddings
        old = emb.weight.data  # (p, e)
        index = torch.arange(new_max, device=old.device) % old.shape[0]
        new = nn.Embedding(new_max, old.shape[1], device=old.device, dtype=old.dtype)
        with torch.no_grad():
            new.weight.copy_(old[index])  # (new_max, e)
        self.base_model.embeddings.position_embeddings = new
        self.config.max_position_embeddings = new_max

    def to_hf(self, path: str | Path, *, segment_means_seq_len: int | None = None) -> None:
        """Write a HuggingFace Nystromformer folder (see :func:`nystrom.model.interop_hf.to_hf`)."""
        from nystrom.model.interop_hf import to_hf

        to_hf(self, path, segment_means_seq_len=segment_means_seq_len)

    def save_pretrained(self, path: str | Path) -> None:
        """Native checkpoint: ``config.json`` (this class + config) and ``model.safetensors``."""
        from nystrom.model.checkpoint import save_checkpoint

        save_checkpoint(self, path)


class NystromformerModel(NystromformerPreTrainedModel):
    """Bare encoder: ``input_ids`` (b, n) -> ``last_hidden_state`` (b, n, e) (+ ``pooler_output`` (b, e))."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.pooler else None
        self.init_weights()

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(b, n) ids -> hidden states (b, n, e) and the bool key padding mask (b, n) or None."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            shape = (
                tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            )
            raise ValueError(f"input_ids must have shape (batch, tokens), got {shape}")
        b, n = input_ids.shape
        _check_ids("input_ids", input_ids, None, self.config.vocab_size)
        mask = to_key_padding_mask(attention_mask, b, n)
        x = self.embeddings(input_ids, token_type_ids)  # (b, n, e)
        return self.encoder(x, mask), mask

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> NystromformerOutput:
        hidden, _ = self.encode(input_ids, attention_mask, token_type_ids)  # (b, n, e)
        pooled = torch.tanh(self.pooler(hidden[:, 0])) if self.pooler is not None else None  # (b, e)
        return NystromformerOutput(last_hidden_state=hidden, pooler_output=pooled)
