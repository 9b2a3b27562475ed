"""Task heads on top of :class:`NystromformerModel`, with transformers' outputs and losses.

Legend: b batch, n tokens, e hidden size, v vocabulary, c classes (labels), k classifier width, r choices.

Every head takes transformers' keywords (``input_ids``, ``attention_mask`` (1 = real token),
``token_type_ids``, ``position_ids``, ``inputs_embeds``, ``labels``, ``output_attentions``,
``output_hidden_states``, ``return_dict``) and returns a ``ModelOutput`` with ``loss`` first when labels are
given; ``return_dict=False`` gives the same fields as a tuple (None fields dropped), as transformers does.
Packed rows (``DataCollatorWithFlattening``: ``position_ids`` restarting, ``seq_idx``, ``cu_seq_lens_q``, ...,
see :meth:`NystromformerModel.encode`) serve the token-level heads and losses; what needs one sequence per
row (pooling, sequence and choice labels, the sentence-order and span losses) raises on them.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import (
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from nystrom.layers.dropout import Dropout
from nystrom.model.configuration_nystromformer import NystromformerConfig
from nystrom.model.head_layers import (
    ClassifierMLP,
    DualSequenceClassifierOutput,
    MLMHead,
    NystromformerForPreTrainingOutput,
    finish,
    flatten_choices,
    mlm_loss,
    pool,
    pretraining_loss,
    sequence_loss,
    span_loss,
)
from nystrom.model.modeling_nystromformer import B, I, NystromformerModel, NystromformerPreTrainedModel, T


class NystromformerForMaskedLM(NystromformerPreTrainedModel):
    """Encoder + tied MLM head: ``logits`` (b, n, v); ``labels`` (b, n) with -100 = ignore."""

    _keys_to_ignore_on_load_unexpected: ClassVar[list[str]] = [r"sop_head\."]  # a pre-training folder
    _tied_weights_keys: ClassVar[dict[str, str]] = {
        "lm_head.decoder.weight": "nystromformer.embeddings.word_embeddings.weight"
    }

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.nystromformer = NystromformerModel(config)
        self.lm_head = MLMHead(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, new: nn.Linear) -> None:
        self.lm_head.decoder = new

    def forward(
        self, input_ids: T = None, attention_mask: T = None, token_type_ids: T = None, position_ids: T = None,
        inputs_embeds: T = None, labels: T = None, output_attentions: B = None, output_hidden_states: B = None,
        return_dict: B = None, *, cu_seq_lens_q: T = None, cu_seq_lens_k: T = None, max_length_q: I = None,
        max_length_k: I = None, seq_idx: T = None,
    ) -> MaskedLMOutput | tuple:  # fmt: skip
        out, _ = self.nystromformer.encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k, max_length_q=max_length_q,
            max_length_k=max_length_k, seq_idx=seq_idx,
        )  # fmt: skip
        logits = self.lm_head(out.last_hidden_state)  # (b, n, v)
        loss = mlm_loss(logits, labels) if labels is not None else None
        result = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return finish(result, return_dict, self.config)


class NystromformerForPreTraining(NystromformerForMaskedLM):
    """MLM + sentence-order prediction (ALBERT/the paper): ``prediction_logits`` (b, n, v), ``sop_logits``
    (b, 2) from the pooler (of a packed row: its first document's); ``loss`` = MLM loss + SOP loss when
    ``labels`` (b, n) and ``sentence_order_label`` (b,) are given (either alone also works)."""

    def __init__(self, config: NystromformerConfig) -> None:
        if not config.pooler:
            raise ValueError(
                "NystromformerForPreTraining needs config.pooler=True (SOP reads the pooled output)"
            )
        NystromformerPreTrainedModel.__init__(self, config)  # not MaskedLM's: one post_init, at the end
        self.nystromformer = NystromformerModel(config)
        self.lm_head = MLMHead(config)
        self.sop_head = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self, input_ids: T = None, attention_mask: T = None, token_type_ids: T = None, position_ids: T = None,
        inputs_embeds: T = None, labels: T = None, sentence_order_label: T = None, output_attentions: B = None,
        output_hidden_states: B = None, return_dict: B = None, *, cu_seq_lens_q: T = None, cu_seq_lens_k: T = None,
        max_length_q: I = None, max_length_k: I = None, seq_idx: T = None,
    ) -> NystromformerForPreTrainingOutput | tuple:  # fmt: skip
        out, _ = self.nystromformer.encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k, max_length_q=max_length_q,
            max_length_k=max_length_k, seq_idx=seq_idx,
            per_row=None if sentence_order_label is None else "the sentence-order loss (sentence_order_label)",
        )  # fmt: skip
        logits = self.lm_head(out.last_hidden_state)  # (b, n, v)
        sop_logits = self.sop_head(out.pooler_output)  # (b, 2)
        result = NystromformerForPreTrainingOutput(
            loss=pretraining_loss(logits, labels, sop_logits, sentence_order_label), prediction_logits=logits,
            sop_logits=sop_logits, hidden_states=out.hidden_states, attentions=out.attentions,
        )  # fmt: skip
        return finish(result, return_dict, self.config)


class NystromformerForSequenceClassification(NystromformerPreTrainedModel):
    """Encoder -> pooling (``config.pooling``) -> :class:`ClassifierMLP`: ``logits`` (b, c). Single texts
    or pairs (``token_type_ids``); ``labels`` per transformers' ``problem_type`` (see :func:`sequence_loss`)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.nystromformer = NystromformerModel(config)
        self.classifier = ClassifierMLP(config.hidden_size, config)
        self.post_init()

    def forward(
        self, input_ids: T = None, attention_mask: T = None, token_type_ids: T = None, position_ids: T = None,
        inputs_embeds: T = None, labels: T = None, output_attentions: B = None, output_hidden_states: B = None,
        return_dict: B = None, *, cu_seq_lens_q: T = None, cu_seq_lens_k: T = None, max_length_q: I = None,
        max_length_k: I = None, seq_idx: T = None,
    ) -> SequenceClassifierOutput | tuple:  # fmt: skip
        out, mask = self.nystromformer.encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k, max_length_q=max_length_q,
            max_length_k=max_length_k, seq_idx=seq_idx, per_row=type(self).__name__,
        )  # fmt: skip
        logits = self.classifier(pool(self.config, out, mask))  # (b, c)
        loss = sequence_loss(self.config, logits, labels) if labels is not None else None
        result = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return finish(result, return_dict, self.config)


class NystromformerForDualSequenceClassification(NystromformerPreTrainedModel):
    """LRA retrieval two-tower: one shared encoder embeds both documents (pooled a, b each (b, e)), the
    classifier reads [a, b, a·b, a−b] (b, 4e) -> ``logits`` (b, c)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.nystromformer = NystromformerModel(config)
        self.classifier = ClassifierMLP(4 * config.hidden_size, config)
        self.post_init()

    def _embed(self, ids, mask, types) -> tuple[torch.Tensor, torch.Tensor]:
        out, kpm = self.nystromformer.encode(ids, mask, types)
        return out.last_hidden_state, pool(self.config, out, kpm)  # (b, n, e), (b, e)

    def forward(
        self,
        input_ids_1: torch.Tensor,
        input_ids_2: torch.Tensor,
        attention_mask_1: torch.Tensor | None = None,
        attention_mask_2: torch.Tensor | None = None,
        labels: T = None,
        token_type_ids_1: torch.Tensor | None = None,
        token_type_ids_2: torch.Tensor | None = None,
        return_dict: bool | None = None,
    ) -> DualSequenceClassifierOutput | tuple:
        if input_ids_1.shape[0] != input_ids_2.shape[0]:
            raise ValueError(
                f"input_ids_1 and input_ids_2 must have the same batch size, got {input_ids_1.shape[0]}"
                f" and {input_ids_2.shape[0]}"
            )
        h1, a = self._embed(input_ids_1, attention_mask_1, token_type_ids_1)
        h2, b = self._embed(input_ids_2, attention_mask_2, token_type_ids_2)
        logits = self.classifier(torch.cat([a, b, a * b, a - b], dim=-1))  # (b, c) from (b, 4e)
        loss = sequence_loss(self.config, logits, labels) if labels is not None else None
        result = DualSequenceClassifierOutput(
            loss=loss, logits=logits, last_hidden_state_1=h1, last_hidden_state_2=h2
        )
        return finish(result, return_dict, self.config)


class NystromformerForTokenClassification(NystromformerPreTrainedModel):
    """Encoder -> dropout -> Linear(e -> c) per token: ``logits`` (b, n, c); ``labels`` (b, n), -100 = ignore."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.nystromformer = NystromformerModel(config)
        self.dropout = Dropout(config.classifier_dropout_p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self, input_ids: T = None, attention_mask: T = None, token_type_ids: T = None, position_ids: T = None,
        inputs_embeds: T = None, labels: T = None, output_attentions: B = None, output_hidden_states: B = None,
        return_dict: B = None, *, cu_seq_lens_q: T = None, cu_seq_lens_k: T = None, max_length_q: I = None,
        max_length_k: I = None, seq_idx: T = None,
    ) -> TokenClassifierOutput | tuple:  # fmt: skip
        out, _ = self.nystromformer.encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k, max_length_q=max_length_q,
            max_length_k=max_length_k, seq_idx=seq_idx,
        )  # fmt: skip
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (b, n, c)
        loss = mlm_loss(logits, labels) if labels is not None else None
        result = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return finish(result, return_dict, self.config)


class NystromformerForQuestionAnswering(NystromformerPreTrainedModel):
    """Extractive QA: Linear(e -> 2) per token -> ``start_logits``, ``end_logits`` (b, n); the loss is the
    mean of the start and end cross-entropies (positions outside the input are ignored, as in transformers)."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.nystromformer = NystromformerModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self, input_ids: T = None, attention_mask: T = None, token_type_ids: T = None, position_ids: T = None,
        inputs_embeds: T = None, start_positions: T = None, end_positions: T = None, output_attentions: B = None,
        output_hidden_states: B = None, return_dict: B = None, *, cu_seq_lens_q: T = None, cu_seq_lens_k: T = None,
        max_length_q: I = None, max_length_k: I = None, seq_idx: T = None,
    ) -> QuestionAnsweringModelOutput | tuple:  # fmt: skip
        out, _ = self.nystromformer.encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k, max_length_q=max_length_q,
            max_length_k=max_length_k, seq_idx=seq_idx,
            per_row=None if start_positions is None else "the span loss (start_positions, end_positions)",
        )  # fmt: skip
        start, end = self.qa_outputs(out.last_hidden_state).unbind(-1)  # (b, n) each
        result = QuestionAnsweringModelOutput(
            loss=span_loss(start, end, start_positions, end_positions), start_logits=start, end_logits=end,
            hidden_states=out.hidden_states, attentions=out.attentions,
        )  # fmt: skip
        return finish(result, return_dict, self.config)


class NystromformerForMultipleChoice(NystromformerPreTrainedModel):
    """Inputs (b, r, n): each choice is encoded, pooled (``config.pooling``), then Linear(e -> e) -> ReLU ->
    Linear(e -> 1) (HF's ``pre_classifier``/``classifier``): ``logits`` (b, r); ``labels`` (b,) choice ids."""

    def __init__(self, config: NystromformerConfig) -> None:
        super().__init__(config)
        self.nystromformer = NystromformerModel(config)
        self.pre_classifier = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(
        self, input_ids: T = None, attention_mask: T = None, token_type_ids: T = None, position_ids: T = None,
        inputs_embeds: T = None, labels: T = None, output_attentions: B = None, output_hidden_states: B = None,
        return_dict: B = None, *, cu_seq_lens_q: T = None, cu_seq_lens_k: T = None, max_length_q: I = None,
        max_length_k: I = None, seq_idx: T = None,
    ) -> MultipleChoiceModelOutput | tuple:  # fmt: skip
        r, flat = flatten_choices(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, seq_idx)  # fmt: skip
        out, mask = self.nystromformer.encode(
            *flat[:5], output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k, max_length_q=max_length_q,
            max_length_k=max_length_k, seq_idx=flat[5], per_row=type(self).__name__,
        )  # fmt: skip
        pooled = F.relu(self.pre_classifier(pool(self.config, out, mask)))  # (b·r, e)
        logits = self.classifier(pooled).view(-1, r)  # (b, r)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        result = MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return finish(result, return_dict, self.config)


MODEL_CLASSES: dict[str, type[NystromformerPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        NystromformerModel,
        NystromformerForMaskedLM,
        NystromformerForPreTraining,
        NystromformerForSequenceClassification,
        NystromformerForDualSequenceClassification,
        NystromformerForTokenClassification,
        NystromformerForQuestionAnswering,
        NystromformerForMultipleChoice,
    )
}
