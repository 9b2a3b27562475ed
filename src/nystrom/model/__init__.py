"""Nyströmformer encoder, task heads, configs/presets and checkpoint interop (HF Nystromformer, BERT).

Legend: b batch, n tokens, e hidden size, v vocabulary, c classes.
"""

from nystrom.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from nystrom.model.config import PRESETS, NystromformerConfig
from nystrom.model.encoder import NystromformerModel, NystromformerOutput, NystromformerPreTrainedModel
from nystrom.model.heads import (
    MODEL_CLASSES,
    NystromformerForDualSequenceClassification,
    NystromformerForMaskedLM,
    NystromformerForPreTraining,
    NystromformerForSequenceClassification,
)
from nystrom.model.interop_bert import from_bert, minilm_path
from nystrom.model.interop_hf import from_hf, to_hf

__all__ = [
    "MODEL_CLASSES",
    "PRESETS",
    "CheckpointError",
    "NystromformerConfig",
    "NystromformerForDualSequenceClassification",
    "NystromformerForMaskedLM",
    "NystromformerForPreTraining",
    "NystromformerForSequenceClassification",
    "NystromformerModel",
    "NystromformerOutput",
    "NystromformerPreTrainedModel",
    "from_bert",
    "from_hf",
    "load_checkpoint",
    "minilm_path",
    "save_checkpoint",
    "to_hf",
]
