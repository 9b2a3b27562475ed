"""Encoder blocks, :class:`NystromformerPreTrainedModel` and the bare :class:`NystromformerModel`.

Legend: b batch, n tokens, e hidden size, f FFN width, v vocabulary, p position-table rows, h heads.

Blocks are post-LN (BERT, HF checkpoints: ``x = LN(x + attn(x))``) or pre-LN (official LRA code:
``x = x + attn(LN(x))``, then a final LayerNorm). Masks: callers pass transformers' ``attention_mask``
(b, n) of 0/1 or bool (1/True = real token); it becomes the bool ``mask`` the attention takes.

Packed documents (``DataCollatorWithFlattening``: several documents end to end in a row, each attending
only to itself): given as transformers does, by ``position_ids`` restarting at each document,
``seq_idx``, or ``cu_seq_lens_q``/``cu_seq_lens_k`` with ``max_length_q``/``max_length_k``; they become
``cu_seqlens`` once per forward (:func:`~nystrom.ops.plan.packed_cu_seqlens`) and every layer's attention
runs each document as a sample of its own. Attention variants other than nystrom and softmax refuse them.
"""

from __future__ import annotations

import contextlib
import math
from typing import ClassVar

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling

from nystrom.layers.norm import LayerNorm
from nystrom.model.configuration_nystromformer import NystromformerConfig
from nystrom.model.layers import (
    Embeddings,
    FeedForward,
    attention_matrix,
    build_attention,
    check_ids,
    to_mask,
)
from nystrom.model.positions import check_scheme, extend_table, scheme_record
from nystrom.ops.plan import packed_cu_seqlens, shared_plan
from nystrom.utils.checks import check_mask

T = torch.Tensor | None  # the optional tensor arguments of every forward
B = bool | None  # the optional switches (None = the config's setting)
I = int | None  # the packed documents' longest length (transformers' max_length_q/max_length_k)


_PACKED_ATTENTIONS = (
    "output_attentions=True with packed documents is not supported: the (b, h, n, n) weights of a packed row "
    "would be a block matrix per document. Run the documents unpacked (one per row, padded) to inspect them"
)


class EncoderLayer(GradientCheckpointingLayer):
    """One block: ``x`` (b, n, e), ``mask`` (b, n) bool or None -> (b, n, e) and, when asked, (b, h, n, n);
    ``cu_seqlens``/``max_seqlen``: packed documents, passed to the attention (see :class:`AttentionBase`)."""

    def __init__(self, config: NystromformerConfig, index: int = 0) -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attention = build_attention(config, index)
        self.attention_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
        *, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        if output_attentions and cu_seqlens is not None:
            raise ValueError(_PACKED_ATTENTIONS)
        a_in = self.attention_norm(x) if self.pre_norm else x
        probs = attention_matrix(self.attention, a_in, mask) if output_attentions else None
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen}
        if self.pre_norm:
            x = x + self.attention(a_in, mask=mask, **packed)  # (b, n, e)
        else:
            x = self.attention_norm(x + self.attention(x, mask=mask, **packed))  # (b, n, e)
        return self.ffn.block(x, self.ffn_norm, pre_norm=self.pre_norm), probs


class Encoder(nn.Module):
    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = (
            LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.final_norm else None
        )

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...] | None]:
        """(b, n, e) -> last hidden state, the inputs of every layer + the output, every layer's weights.
        ``cu_seqlens`` (documents + 1,) int32, ``max_seqlen``: packed documents (each attends to itself)."""
        states: list[torch.Tensor] = []
        weights: list[torch.Tensor] = []
        # The layers' attention takes an all-True mask as None (check_mask): so does the block, to admit it.
        mask = check_mask(mask, x.shape[0], x.shape[1], x.device)
        # What the mask and the documents determine (landmark assignment, additive masks, the documents'
        # gather plan) is computed once for all layers.
        block = contextlib.nullcontext() if torch.compiler.is_compiling() else shared_plan(mask, cu_seqlens)
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen}
        with block:
            for layer in self.layers:
                if output_hidden_states:  # only then: each kept input is a (b, n, e) tensor alive to the end
                    states.append(x)
                x, probs = layer(x, mask, output_attentions, **packed)  # (b, n, e)
                if probs is not None:
                    weights.append(probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
        states.append(x)
        return (
            x,
            tuple(states) if output_hidden_states else None,
            tuple(weights) if output_attentions else None,
        )


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

    def resize_position_embeddings(
        self, new_max: int, *, positions: str = "copy", alpha: float | None = None
    ) -> None:
        """Make the position table ``new_max`` rows. Growing, the new table comes from the learned one by
        ``positions`` (:mod:`nystrom.model.positions`): ``"copy"`` (row i = old row ``i % old_rows``, the
        official code's tiling and Longformer's recipe), ``"interpolate"`` or ``"hierarchical"`` (Su's
        decomposition with ``alpha``, rows below the old length unchanged); the scheme is recorded in
        ``config.position_extension``. Shrinking keeps the first ``new_max`` rows. Reserved leading rows
        (``config.position_offset``) are kept as they are. Updates ``config.max_position_embeddings``."""
        if not isinstance(new_max, int) or isinstance(new_max, bool) or new_max < 1:
            raise ValueError(f"new_max must be a positive int, got {new_max!r}")
        embeddings = self.base_model.embeddings
        old = embeddings.position_embeddings.weight.data  # (offset + p, e)
        off = embeddings.offset
        check_scheme(positions, alpha, source_rows=old.shape[0] - off, rows=new_max)
        new = nn.Embedding(off + new_max, old.shape[1], device=old.device, dtype=old.dtype)
        with torch.no_grad():
            new.weight[:off].copy_(old[:off])
            new.weight[off:].copy_(extend_table(old[off:], new_max, scheme=positions, alpha=alpha))  # (N, e)
        embeddings.position_embeddings = new
        record = self.config.position_extension
        if new_max > old.shape[0] - off:
            self.config.position_extension = scheme_record(positions, alpha, old.shape[0] - off)
        elif record is not None and new_max <= record["source_length"]:  # back within the source's rows
            self.config.position_extension = None
        self.config.max_position_embeddings = new_max

    def to_hf(self, path, *, segment_means_seq_len: int | None = None) -> None:
        """Write a transformers ``NystromformerModel``/``…For*`` folder (see :func:`nystrom.model.to_hf`)."""
        from nystrom.convert.export_hf import to_hf

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
        self, input_ids: T = None, attention_mask: T = None, token_type_ids: T = None, position_ids: T = None,
        inputs_embeds: T = None, *, output_attentions: B = None, output_hidden_states: B = None,
        cu_seq_lens_q: T = None, cu_seq_lens_k: T = None, max_length_q: I = None, max_length_k: I = None,
        seq_idx: T = None, per_row: str | None = None,
    ) -> tuple[BaseModelOutputWithPooling, torch.Tensor | None]:  # fmt: skip
        """The model output and the bool padding mask (b, n) (None = no padding), for the heads.

        Packed documents (transformers' forms, see the module docstring) become ``cu_seqlens`` here, once
        per forward; the position embeddings read ``position_ids`` as given (restarting at each document).
        ``per_row``: the caller's name when it needs one sequence per row (pooling, a label per row), which
        packed rows do not have: they then raise, naming it. So does ``output_attentions``."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(
                "give exactly one of input_ids (batch, tokens) and inputs_embeds (batch, tokens, e)"
            )
        if input_ids is not None:
            if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
                shape = (
                    tuple(input_ids.shape)
                    if isinstance(input_ids, torch.Tensor)
                    else type(input_ids).__name__
                )
                raise ValueError(f"input_ids must have shape (batch, tokens), got {shape}")
            check_ids("input_ids", input_ids, None, self.config.vocab_size)
            inputs_embeds = self.embeddings.word_embeddings(input_ids)  # (b, n, e)
        elif inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.config.hidden_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, tokens, {self.config.hidden_size}),"
                f" got {tuple(inputs_embeds.shape)}"
            )
        b, n, _ = inputs_embeds.shape
        mask = to_mask(attention_mask, b, n)
        cu_seqlens, max_seqlen = packed_cu_seqlens(
            b, n, attention_mask=mask, position_ids=position_ids, seq_idx=seq_idx, cu_seq_lens_q=cu_seq_lens_q,
            cu_seq_lens_k=cu_seq_lens_k, max_length_q=max_length_q, max_length_k=max_length_k,
        )  # fmt: skip
        output_attentions = bool(
            self.config.output_attentions if output_attentions is None else output_attentions
        )
        if cu_seqlens is not None and (per_row is not None or output_attentions):
            raise ValueError(_PACKED_ATTENTIONS if per_row is None else (
                f"{per_row} needs one sequence per row (it pools a row or reads one label per row), but these "
                "rows pack several documents (position_ids restart, or seq_idx / cu_seq_lens_q was given): feed "
                "one document per row (a padded batch, e.g. DataCollatorWithPadding), or use a token-level head"
            ))  # fmt: skip
        x = self.embeddings(inputs_embeds, token_type_ids, position_ids)  # (b, n, e)
        hidden, states, weights = self.encoder(
            x,
            mask,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            output_attentions=output_attentions,
            output_hidden_states=bool(
                self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
            ),
        )
        # (b, e): each row's first token; in a packed row, its first document's
        pooled = torch.tanh(self.pooler(hidden[:, 0])) if self.pooler is not None else None
        out = BaseModelOutputWithPooling(
            last_hidden_state=hidden, pooler_output=pooled, hidden_states=states, attentions=weights
        )
        return out, mask

    def forward(
        self, input_ids: T = None, attention_mask: T = None, token_type_ids: T = None, position_ids: T = None,
        inputs_embeds: T = None, output_attentions: B = None, output_hidden_states: B = None, return_dict: B = None,
        *, cu_seq_lens_q: T = None, cu_seq_lens_k: T = None, max_length_q: I = None, max_length_k: I = None,
        seq_idx: T = None,
    ) -> BaseModelOutputWithPooling | tuple:  # fmt: skip
        """``input_ids`` (b, n) or ``inputs_embeds`` (b, n, e); ``attention_mask`` (b, n), 1 = real token;
        packed documents by ``position_ids`` restarting, ``seq_idx`` or ``cu_seq_lens_q``, see :meth:`encode`."""
        out, _ = self.encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k, max_length_q=max_length_q,
            max_length_k=max_length_k, seq_idx=seq_idx,
        )  # fmt: skip
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()
