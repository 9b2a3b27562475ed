"""Building blocks of the encoder: embeddings, feed-forward, attention construction, masks, and the
attention weights ``output_attentions`` returns.

Legend: b batch, n tokens, e hidden size, f FFN width, v vocabulary, p position-table rows, h heads.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nystrom.layers.dense import dense_module
from nystrom.layers.dropout import Dropout
from nystrom.layers.ffn import feed_forward, in_row_blocks
from nystrom.layers.norm import LayerNorm
from nystrom.model.configuration_nystromformer import NystromformerConfig
from nystrom.ops.nystrom import nystrom_factors
from nystrom.utils.checks import value_checks_enabled

#: bytes of (rows, f) FFN activations per block in inference (see :meth:`FeedForward.block`)
FFN_BLOCK_BYTES = 8 << 20
#: ``output_attentions=True`` materialises (b, h, n, n) per layer; longer inputs raise instead
MAX_ATTENTION_TOKENS = 4096


def to_mask(attention_mask: torch.Tensor | None, b: int, n: int, *, name: str = "attention_mask"):
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
    if value_checks_enabled(attention_mask) and not bool(
        ((attention_mask == 0) | (attention_mask == 1)).all()
    ):
        raise ValueError(f"{name} must hold only 0 (padding) and 1 (real token), or be a bool tensor")
    return attention_mask != 0


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over real tokens: ``x`` (b, n, e), mask (b, n) bool or None -> (b, e)."""
    if mask is None:
        return x.mean(1)
    w = mask.to(x.dtype).unsqueeze(-1)  # (b, n, 1)
    return (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # (b, e)


def check_ids(name: str, ids: torch.Tensor, shape: tuple[int, ...] | None, limit: int) -> None:
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
        self.norm = LayerNorm(e, eps=config.layer_norm_eps) if config.embedding_norm else None
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
            check_ids("position_ids", position_ids, None, p)
            x = inputs_embeds + self.position_embeddings(position_ids.expand(b, n) + self.offset)  # (b, n, e)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                x = x + self.token_type_embeddings.weight[0]
            else:
                check_ids("token_type_ids", token_type_ids, (b, n), self.token_type_embeddings.num_embeddings)
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
        inner_dropout = self.training and self.inner_dropout.p > 0
        if torch.is_grad_enabled() and not inner_dropout and not torch.compiler.is_compiling():
            # training: keeps x and the pre-activation only, blocked backward (layers/ffn.py)
            y = feed_forward(x, self.dense_in.weight, self.dense_in.bias, self.dense_out.weight, self.dense_out.bias,
                             activation=self.act)  # fmt: skip
            return self.dropout(y)  # (b, n, e)
        # inference: act applied inside the GEMM (a oneDNN post-op) (layers/dense.py); elsewhere F.linear, then act
        hidden = self.inner_dropout(dense_module(self.dense_in, x, activation_name=self.act))  # (b, n, f)
        return self.dropout(dense_module(self.dense_out, hidden))  # (b, n, e)

    def block(self, x: torch.Tensor, norm: nn.LayerNorm, *, pre_norm: bool) -> torch.Tensor:
        """The FFN sub-layer with its residual and LayerNorm: ``norm(x + ffn(x))`` (post-LN) or
        ``x + ffn(norm(x))`` (pre-LN), x (b, n, e) -> (b, n, e).

        Without autograd (inference) the b·n rows go through in blocks of :data:`FFN_BLOCK_BYTES` of
        (rows, f) activations: the (b, n, f) intermediate, the model's largest tensor, never exists (peak
        memory), the block's activations stay in cache between the GEMMs, GELU and LayerNorm, and its
        buffers are reused instead of fresh pages (glibc maps every block of ≥ 32 MiB anew and
        page-faults it: at n = 16384 the FFN's (n, f) bias copy and GELU measured 2–3× slower than the
        same work in blocks). Same values as the unblocked path (row-wise maths)."""

        def sublayer(t: torch.Tensor) -> torch.Tensor:
            return t + self(norm(t)) if pre_norm else norm(t + self(t))

        # on the accelerator path in one call: blocks would only add launches (layers/ffn.py)
        return in_row_blocks(sublayer, x, self.dense_in.out_features, FFN_BLOCK_BYTES)


def build_attention(config: NystromformerConfig, index: int = 0) -> nn.Module:
    """Layer ``index``'s attention module, from its spec (:meth:`NystromformerConfig.layer_attention`)."""
    from nystrom.attention import REGISTRY

    spec = config.layer_attention(index)
    options = {k: v for k, v in spec.items() if k != "name"}
    return REGISTRY[spec["name"]](
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
        raise ValueError(
            f"output_attentions is available for 'nystrom' and 'softmax' attention, not {name!r}"
        )
    h, d = attn.heads, attn.dim_head
    q, k, _ = attn.qkv(x).unflatten(-1, (3, h, d)).permute(2, 0, 3, 1, 4)  # each (b, h, n, d)
    if name == "softmax":
        s = (q @ k.mT).float() / math.sqrt(d)  # (b, h, n, n)
        if mask is not None:
            s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
        return torch.softmax(s, -1).to(x.dtype)
    f, z, b = nystrom_factors(
        q, k, num_landmarks=attn.num_landmarks, mask=mask,
        pinv_iterations=attn.pinv_iterations, pinv=attn.pinv, pinv_init=attn.pinv_init,
    )  # fmt: skip
    return (f @ z @ b).to(x.dtype)  # (b, h, n, n)
