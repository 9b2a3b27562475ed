"""nystrom: the Nyströmformer (Xiong et al., AAAI 2021) — O(n) Nyström self-attention for PyTorch."""

from nystrom import functional
from nystrom.attention import REGISTRY, NystromAttention, SoftmaxAttention
from nystrom.functional import nystrom_attention, segment_means, softmax_attention
from nystrom.model import (  # registers the models with transformers' Auto classes
    NystromformerConfig,
    NystromformerForMaskedLM,
    NystromformerForSequenceClassification,
    NystromformerModel,
    convert_legacy_checkpoint,
    from_bert,
    from_hf,
    from_roberta,
    to_hf,
    to_long,
)

__version__ = "0.1.0"

__all__ = [
    "REGISTRY",
    "NystromAttention",
    "NystromformerConfig",
    "NystromformerForMaskedLM",
    "NystromformerForSequenceClassification",
    "NystromformerModel",
    "SoftmaxAttention",
    "__version__",
    "convert_legacy_checkpoint",
    "from_bert",
    "from_hf",
    "from_roberta",
    "functional",
    "nystrom_attention",
    "segment_means",
    "softmax_attention",
    "to_hf",
    "to_long",
]
