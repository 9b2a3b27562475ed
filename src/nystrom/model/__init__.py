"""Nyströmformer models as transformers models: config, encoder, task heads, Auto registration, interop.

Legend: b batch, n tokens, e hidden size, v vocabulary, c classes.

Importing this package (``import nystrom`` does) registers :class:`NystromformerConfig` (model_type
``"nystrom-nystromformer"``) and every head with transformers' Auto classes, so ``AutoConfig``,
``AutoModel``, ``AutoModelForMaskedLM``, ``AutoModelForPreTraining``, ``AutoModelForSequenceClassification``,
``AutoModelForTokenClassification``, ``AutoModelForQuestionAnswering`` and ``AutoModelForMultipleChoice``
load our folders, and ``Trainer``/``pipeline`` run on them.
"""

import transformers

from nystrom.model.configuration_nystromformer import MODEL_TYPE, PRESETS, NystromformerConfig
from nystrom.model.head_layers import DualSequenceClassifierOutput, NystromformerForPreTrainingOutput
from nystrom.model.interop_bert import from_bert, from_roberta, minilm_path
from nystrom.model.interop_hf import from_hf, to_hf
from nystrom.model.layers import MAX_ATTENTION_TOKENS
from nystrom.model.legacy import convert_legacy_checkpoint
from nystrom.model.long import source_length, to_long
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
from nystrom.model.tokenizer import save_tokenizer
from nystrom.model.weights import CheckpointError

#: transformers Auto class -> our model registered with it
AUTO_CLASSES = {
    transformers.AutoModel: NystromformerModel,
    transformers.AutoModelForMaskedLM: NystromformerForMaskedLM,
    transformers.AutoModelForPreTraining: NystromformerForPreTraining,
    transformers.AutoModelForSequenceClassification: NystromformerForSequenceClassification,
    transformers.AutoModelForTokenClassification: NystromformerForTokenClassification,
    transformers.AutoModelForQuestionAnswering: NystromformerForQuestionAnswering,
    transformers.AutoModelForMultipleChoice: NystromformerForMultipleChoice,
}


def _register() -> None:
    # exist_ok: a re-import (importlib.reload, a second copy of the package on the path) is harmless
    transformers.AutoConfig.register(MODEL_TYPE, NystromformerConfig, exist_ok=True)
    for auto, cls in AUTO_CLASSES.items():
        auto.register(NystromformerConfig, cls, exist_ok=True)


_register()

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
