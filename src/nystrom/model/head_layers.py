"""Pieces the task heads share: their output types, the MLM and classifier modules, losses and pooling.

Legend: b batch, n tokens, e hidden size, v vocabulary, c classes (labels), k classifier width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import ModelOutput

from nystrom.layers.dense import activation
from nystrom.layers.dropout import Dropout
from nystrom.layers.norm import LayerNorm
from nystrom.model.configuration_nystromformer import NystromformerConfig
from nystrom.model.layers import masked_mean


@dataclass
class NystromformerForPreTrainingOutput(ModelOutput):
    """``loss`` (MLM + SOP), ``prediction_logits`` (b, n, v), ``sop_logits`` (b, 2), as ALBERT's."""

    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    sop_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class DualSequenceClassifierOutput(ModelOutput):
    """``loss``, ``logits`` (b, c) and each document's ``last_hidden_state`` (b, n1, e), (b, n2, e)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    last_hidden_state_1: torch.Tensor | None = None
    last_hidden_state_2: torch.Tensor | None = None


class MLMHead(nn.Module):
    """HF ``cls.predictions``: dense -> act -> LayerNorm -> decoder (weight tied to the word embeddings).

    ``h`` (b, n, e) -> logits (b, n, v)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        self.act = config.hidden_act
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(activation(self.act, self.dense(h)))  # (b, n, e)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(h))  # (b, n, v)


class ClassifierMLP(nn.Module):
    """dropout -> Linear(in -> k) -> act -> dropout -> Linear(k -> c): (b, in) -> (b, c). With ReLU and no
    dropout it is the official LRA head; with the encoder's activation, HF's ``classifier.dense/out_proj``."""

    def __init__(self, in_features: int, config: NystromformerConfig) -> None:
        super().__init__()
        self.act = config.classifier_act
        self.dropout = Dropout(config.classifier_dropout_p)
        self.dense = nn.Linear(in_features, config.classifier_hidden)
        self.out_proj = nn.Linear(config.classifier_hidden, config.num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dropout(activation(self.act, self.dense(self.dropout(x))))  # (b, k)
        return self.out_proj(x)  # (b, c)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over positions whose label is not -100: logits (b, n, v), labels (b, n)."""
    if tuple(labels.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"labels must have shape (batch, tokens) = {tuple(logits.shape[:2])}, got {tuple(labels.shape)}"
        )
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)


def pretraining_loss(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    sop_logits: torch.Tensor,
    sop_labels: torch.Tensor | None,
) -> torch.Tensor | None:
    """MLM loss (logits (b, n, v), labels (b, n)) + sentence-order loss (sop_logits (b, 2), sop_labels (b,)),
    of those whose labels are given; None if neither is."""
    losses = [] if labels is None else [mlm_loss(logits, labels)]
    if sop_labels is not None:
        losses.append(F.cross_entropy(sop_logits.float(), sop_labels.view(-1)))
    return sum(losses[1:], losses[0]) if losses else None


def flatten_choices(*inputs: torch.Tensor | None) -> tuple[int, list[torch.Tensor | None]]:
    """Multiple-choice inputs (b, r, n[, e]) (the first given sets r) -> r and each flattened to (b·r, n[, e])."""
    first = next((t for t in inputs if t is not None), None)
    if first is None or first.dim() < 3:
        raise ValueError("multiple choice inputs must have shape (batch, choices, tokens[, e])")
    return first.shape[1], [None if t is None else t.flatten(0, 1) for t in inputs]


def span_loss(
    start: torch.Tensor,
    end: torch.Tensor,
    start_positions: torch.Tensor | None,
    end_positions: torch.Tensor | None,
) -> torch.Tensor | None:
    """Extractive QA's loss: the mean of the start and end cross-entropies over the n positions of
    ``start``, ``end`` (b, n); positions (b,) outside [0, n) are ignored, as in transformers. None unless
    both positions are given."""
    if start_positions is None or end_positions is None:
        return None
    n = start.shape[1]
    s, e = start_positions.view(-1).clamp(0, n), end_positions.view(-1).clamp(0, n)
    return (
        F.cross_entropy(start.float(), s, ignore_index=n) + F.cross_entropy(end.float(), e, ignore_index=n)
    ) / 2


def sequence_loss(config: NystromformerConfig, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' ``problem_type`` rules: regression (MSE) when c == 1, single-label CE for int labels
    (b,), multi-label BCE-with-logits for float labels (b, c); the inferred type is stored in the config."""
    b, c = logits.shape
    if config.problem_type is None:
        if c == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    want = {"regression": [(b,), (b, 1)], "single_label_classification": [(b,)],
            "multi_label_classification": [(b, c)]}[config.problem_type]  # fmt: skip
    if tuple(labels.shape) not in want:
        raise ValueError(
            f"labels for {config.problem_type} must have shape {' or '.join(map(str, want))}, got {tuple(labels.shape)}"
        )
    if config.problem_type == "regression":
        return F.mse_loss(logits.float().view(labels.shape), labels.float())
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits.float(), labels.long())
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def pool(
    config: NystromformerConfig, out: BaseModelOutputWithPooling, mask: torch.Tensor | None
) -> torch.Tensor:
    """Sequence features (b, e) by ``config.pooling``: first token, mean over real tokens, the official
    LRA mean (padding zeroed but counted in the denominator), or BERT's tanh pooler."""
    h = out.last_hidden_state  # (b, n, e)
    if config.pooling == "cls":
        return h[:, 0]
    if config.pooling == "mean":
        return masked_mean(h, mask)
    if config.pooling == "mean_with_padding":
        return h.mean(1) if mask is None else (h * mask.unsqueeze(-1).to(h.dtype)).mean(1)  # (b, e)
    return out.pooler_output


def finish(output: ModelOutput, return_dict: bool | None, config: NystromformerConfig):
    return output if (config.return_dict if return_dict is None else return_dict) else output.to_tuple()
