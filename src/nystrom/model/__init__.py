"""Nyströmformer models as transformers models: config, encoder, task heads, Auto registration, interop.

Legend: b batch, n tokens, e hidden size, v vocabulary, c classes.

``import nystrom`` registers :class:`NystromformerConfig` (model_type ``"nystrom-nystromformer"``) and every
head with transformers' Auto classes (when transformers loads them: :mod:`nystrom._registration`), so
``AutoConfig``, ``AutoModel``, ``AutoModelForMaskedLM``, ``AutoModelForPreTraining``,
``AutoModelForSequenceClassification``, ``AutoModelForTokenClassification``, ``AutoModelForQuestionAnswering``
and ``AutoModelForMultipleChoice`` load our folders, and ``Trainer``/``pipeline`` run on them. The names
below load their modules on first use.
"""

from typing import TYPE_CHECKING

from nystrom._lazy import lazy_attributes

_M = "nystrom.model."
_NAMES = {
    "MODEL_TYPE": _M + "configuration_nystromformer", "PRESETS": _M + "configuration_nystromformer",
    "NystromformerConfig": _M + "configuration_nystromformer",
    "DualSequenceClassifierOutput": _M + "head_layers", "NystromformerForPreTrainingOutput": _M + "head_layers",
    "from_bert": _M + "interop_bert", "from_roberta": _M + "interop_bert", "minilm_path": _M + "interop_bert",
    "from_hf": _M + "interop_hf", "to_hf": _M + "export_hf", "MAX_ATTENTION_TOKENS": _M + "layers",
    "convert_legacy_checkpoint": _M + "legacy", "source_length": _M + "long", "to_long": _M + "long",
    "NystromformerModel": _M + "modeling_nystromformer", "NystromformerPreTrainedModel": _M + "modeling_nystromformer",
    "save_tokenizer": _M + "tokenizer", "CheckpointError": _M + "weights", "AUTO_CLASSES": _M + "auto",
    **dict.fromkeys(
        ("MODEL_CLASSES", "NystromformerForDualSequenceClassification", "NystromformerForMaskedLM",
         "NystromformerForMultipleChoice", "NystromformerForPreTraining", "NystromformerForQuestionAnswering",
         "NystromformerForSequenceClassification", "NystromformerForTokenClassification"),
        _M + "modeling_heads",
    ),
}  # fmt: skip
__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
__all__ = sorted(_NAMES)

if TYPE_CHECKING:
    from nystrom.model.auto import AUTO_CLASSES
    from nystrom.model.configuration_nystromformer import MODEL_TYPE, PRESETS, NystromformerConfig
    from nystrom.model.export_hf import to_hf
    from nystrom.model.head_layers import DualSequenceClassifierOutput, NystromformerForPreTrainingOutput
    from nystrom.model.interop_bert import from_bert, from_roberta, minilm_path
    from nystrom.model.interop_hf import from_hf
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
