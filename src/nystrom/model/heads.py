"""Task heads on top of :class:`NystromformerModel`.

Legend: b batch, n tokens, e hidden size, v vocabulary, c classes, k hidden width of the classifier.

All heads are called ``model(input_ids, attention_mask=None, token_type_ids=None, labels=None)`` (the
dual model takes two documents) and return :class:`NystromformerOutput` with ``logits`` and, when labels
are given, ``loss``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nystrom.model.config import NystromformerConfig
from nystrom.model.encoder import (
    NystromformerModel,
    NystromformerOutput,
    NystromformerPreTrainedModel,
    activation,
    masked_mean,
)


class MLMHead(nn.Module):
    """HF ``cls.predictions``: dense -> act -> LayerNorm -> decoder tied to the word embeddings + bias.

    ``h`` (b, n, e), ``word_weight`` (v, e) -> logits (b, n, v)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__()
        self.act = config.hidden_act
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: torch.Tensor, word_weight: torch.Tensor) -> torch.Tensor:
        h = self.norm(activation(self.act, self.dense(h)))  # (b, n, e)
        return F.linear(h, word_weight, self.bias)  # (b, n, v)


class ClassifierMLP(nn.Module):
    """The official LRA head: Linear(in -> k) -> ReLU -> Linear(k -> c): (b, in) -> (b, c)."""

    def __init__(self, in_features: int, hidden: int, num_labels: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, hidden)
        self.out = nn.Linear(hidden, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.dense(x)))  # (b, c)


def _mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over positions whose label is not -100: logits (b, n, v), labels (b, n)."""
    if tuple(labels.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"labels must have shape (batch, tokens) = {tuple(logits.shape[:2])}, got {tuple(labels.shape)}"
        )
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)


def _classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """CE for c > 1 (labels (b,) int), MSE regression for c == 1 (labels (b,) float)."""
    if labels.shape[0] != logits.shape[0] or labels.dim() != 1:
        raise ValueError(f"labels must have shape ({logits.shape[0]},), got {tuple(labels.shape)}")
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


def pool(
    config: NystromformerConfig, out: NystromformerOutput, key_padding_mask: torch.Tensor | None
) -> torch.Tensor:
    """Sequence features (b, e) by ``config.pooling``: first token, mean over real tokens, the official
    LRA mean (padding zeroed but counted in the denominator), or BERT's tanh pooler."""
    h = out.last_hidden_state  # (b, n, e)
    if config.pooling == "cls":
        return h[:, 0]
    if config.pooling == "mean":
        return masked_mean(h, key_padding_mask)
    if config.pooling == "mean_with_padding":
        if key_padding_mask is None:
            return h.mean(1)
        return (h * key_padding_mask.unsqueeze(-1).to(h.dtype)).mean(1)  # (b, e)
    return out.pooler_output


class NystromformerForMaskedLM(NystromformerPreTrainedModel):
    """Encoder + tied MLM head: logits (b, n, v); ``labels`` (b, n) with -100 = ignore."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.nystromformer = NystromformerModel(config)
        self.lm_head = MLMHead(config)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> NystromformerOutput:
        out = self.nystromformer(input_ids, attention_mask, token_type_ids)
        out.logits = self.lm_head(out.last_hidden_state, self.nystromformer.embeddings.word_embeddings.weight)
        if labels is not None:
            out.loss = _mlm_loss(out.logits, labels)
        return out


class NystromformerForPreTraining(NystromformerPreTrainedModel):
    """MLM + sentence-order prediction (ALBERT/the paper): ``logits`` (b, n, v), ``sop_logits`` (b, 2)
    from the pooler; loss = MLM loss + SOP loss when ``labels`` (b, n) and ``sentence_order_label`` (b,)
    are given (either alone also works)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        if not config.pooler:
            raise ValueError(
                "NystromformerForPreTraining needs config.pooler=True (SOP reads the pooled output)"
            )
        self.nystromformer = NystromformerModel(config)
        self.lm_head = MLMHead(config)
        self.sop_head = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        sentence_order_label: torch.Tensor | None = None,
    ) -> NystromformerOutput:
        out = self.nystromformer(input_ids, attention_mask, token_type_ids)
        out.logits = self.lm_head(out.last_hidden_state, self.nystromformer.embeddings.word_embeddings.weight)
        out.sop_logits = self.sop_head(out.pooler_output)  # (b, 2)
        losses = []
        if labels is not None:
            losses.append(_mlm_loss(out.logits, labels))
        if sentence_order_label is not None:
            losses.append(_classification_loss(out.sop_logits, sentence_order_label))
        if losses:
            out.loss = sum(losses[1:], losses[0])
        return out


class NystromformerForSequenceClassification(NystromformerPreTrainedModel):
    """Encoder -> pooling (``config.pooling``) -> Linear-ReLU-Linear: logits (b, c)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.nystromformer = NystromformerModel(config)
        self.classifier = ClassifierMLP(config.hidden_size, config.classifier_hidden, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> NystromformerOutput:
        hidden, mask = self.nystromformer.encode(input_ids, attention_mask, token_type_ids)
        out = NystromformerOutput(last_hidden_state=hidden)
        if self.nystromformer.pooler is not None:
            out.pooler_output = torch.tanh(self.nystromformer.pooler(hidden[:, 0]))  # (b, e)
        out.logits = self.classifier(pool(self.config, out, mask))  # (b, c)
        if labels is not None:
            out.loss = _classification_loss(out.logits, labels)
        return out


class NystromformerForDualSequenceClassification(NystromformerPreTrainedModel):
    """LRA retrieval two-tower: one shared encoder embeds both documents (pooled a, b each (b, e)), the
    classifier reads [a, b, a·b, a−b] (b, 4e) -> logits (b, c)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.nystromformer = NystromformerModel(config)
        self.classifier = ClassifierMLP(4 * config.hidden_size, config.classifier_hidden, config.num_labels)
        self.init_weights()

    def _embed(self, ids, mask, types) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, kpm = self.nystromformer.encode(ids, mask, types)  # (b, n, e)
        out = NystromformerOutput(last_hidden_state=hidden)
        if self.nystromformer.pooler is not None:
            out.pooler_output = torch.tanh(self.nystromformer.pooler(hidden[:, 0]))
        return hidden, pool(self.config, out, kpm)  # (b, n, e), (b, e)

    def forward(
        self,
        input_ids_1: torch.Tensor,
        input_ids_2: torch.Tensor,
        attention_mask_1: torch.Tensor | None = None,
        attention_mask_2: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        token_type_ids_1: torch.Tensor | None = None,
        token_type_ids_2: torch.Tensor | None = None,
    ) -> NystromformerOutput:
        if input_ids_1.shape[0] != input_ids_2.shape[0]:
            raise ValueError(
                f"input_ids_1 and input_ids_2 must have the same batch size, got {input_ids_1.shape[0]}"
                f" and {input_ids_2.shape[0]}"
            )
        h1, a = self._embed(input_ids_1, attention_mask_1, token_type_ids_1)
        h2, b = self._embed(input_ids_2, attention_mask_2, token_type_ids_2)
        features = torch.cat([a, b, a * b, a - b], dim=-1)  # (b, 4e)
        out = NystromformerOutput(
            last_hidden_state=h1, last_hidden_state_2=h2, logits=self.classifier(features)
        )
        if labels is not None:
            out.loss = _classification_loss(out.logits, labels)
        return out


MODEL_CLASSES: dict[str, type[NystromformerPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        NystromformerModel,
        NystromformerForMaskedLM,
        NystromformerForPreTraining,
        NystromformerForSequenceClassification,
        NystromformerForDualSequenceClassification,
    )
}
