"""Nyströmformer models as transformers models: config, encoder, task heads, Auto registration; and, for this
public path, the converters of :mod:`nystrom.convert` (from/to transformers, BERT/RoBERTa import, legacy
folders, long conversion, tokenizers) re-exported.

Legend: b batch, n tokens, e hidden size, v vocabulary, c classes.

Importing this package registers :class:`NystromformerConfig` (model_type ``"nystrom-nystromformer"``) and
every head with transformers' Auto classes, as flash-linear-attention registers its models: ``AutoConfig``,
``AutoModel``, ``AutoModelForMaskedLM``, ``AutoModelForPreTraining``, ``AutoModelForSequenceClassification``,
``AutoModelForTokenClassification``, ``AutoModelForQuestionAnswering`` and ``AutoModelForMultipleChoice``
then load our folders, and ``Trainer``/``pipeline`` run on them.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from nystrom.convert.export_hf import to_hf
from nystrom.convert.interop_bert import from_bert, from_roberta, minilm_path
from nystrom.convert.interop_hf import from_hf
from nystrom.convert.legacy import convert_legacy_checkpoint
from nystrom.convert.long import source_length, to_long
from nystrom.convert.tokenizer import save_tokenizer
from nystrom.convert.weights import CheckpointError
from nystrom.model.configuration_nystromformer import MODEL_TYPE, PRESETS, NystromformerConfig
from nystrom.model.head_layers import DualSequenceClassifierOutput, NystromformerForPreTrainingOutput
from nystrom.model.layers import MAX_ATTENTION_TOKENS
from nystrom.model.modeling_heads import (
    MODEL_CLASSES,
    NystromformerForDualSequenceClassification,
    NystromformerForMaskedLM,
    NystromformerForMultipleChoice,
    NystromformerForPreTraining,
    NystromformerForQuestionAnswering,
    NystromformerForSequenceClassification,
    NystromformerForTokenClassification,
)
from nystrom.model.modeling_nystromformer import NystromformerModel, NystromformerPreTrainedModel

#: transformers Auto class -> our model registered with it
AUTO_CLASSES = {
    AutoModel: NystromformerModel,
    AutoModelForMaskedLM: NystromformerForMaskedLM,
    AutoModelForPreTraining: NystromformerForPreTraining,
    AutoModelForSequenceClassification: NystromformerForSequenceClassification,
    AutoModelForTokenClassification: NystromformerForTokenClassification,
    AutoModelForQuestionAnswering: NystromformerForQuestionAnswering,
    AutoModelForMultipleChoice: NystromformerForMultipleChoice,
}

AutoConfig.register(MODEL_TYPE, NystromformerConfig, exist_ok=True)
for _auto, _model in AUTO_CLASSES.items():
    _auto.register(NystromformerConfig, _model, exist_ok=True)

__all__ = [
    "AUTO_CLASSES",
    "MAX_ATTENTION_TOKENS",
    "MODEL_CLASSES",
    "MODEL_TYPE",
    "PRESETS",
    "CheckpointError",
    "DualSequenceClassifierOutput",
    "NystromformerConfig",
    "NystromformerForDualSequenceClassification",
    "NystromformerForMaskedLM",
    "NystromformerForMultipleChoice",
    "NystromformerForPreTraining",
    "NystromformerForPreTrainingOutput",
    "NystromformerForQuestionAnswering",
    "NystromformerForSequenceClassification",
    "NystromformerForTokenClassification",
    "NystromformerModel",
    "NystromformerPreTrainedModel",
    "convert_legacy_checkpoint",
    "from_bert",
    "from_hf",
    "from_roberta",
    "minilm_path",
    "save_tokenizer",
    "source_length",
    "to_hf",
    "to_long",
]
