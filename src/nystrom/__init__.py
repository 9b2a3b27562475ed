"""nystrom: the Nyströmformer (Xiong et al., AAAI 2021) — O(n) Nyström self-attention for PyTorch.

The library: ``nystrom.functional`` (pure tensor maths), ``nystrom.attention`` (modules behind one
interface and a registry), ``nystrom.model`` (transformers models) and ``nystrom.compat`` (drop-ins for
lucidrains' ``nystrom-attention`` and transformers' attention interface). ``import nystrom`` imports torch
and transformers, registers our models with transformers' Auto classes (``AutoModel*.from_pretrained`` and
``pipeline`` read our folders) and registers ``attn_implementation="nystrom"`` for transformers models
that use its attention interface (BERT, RoBERTa, ViT, ...). The experiments, benchmarks and the
``nystrom`` command line live in the separate package ``nystrom_lab``, which this one never imports.
"""

from nystrom import functional
from nystrom.attention import REGISTRY, NystromAttention, SoftmaxAttention
from nystrom.compat import hf_attention  # registers attn_implementation="nystrom" with transformers
from nystrom.functional import nystrom_attention, segment_means, softmax_attention
from nystrom.model import (
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
    "hf_attention",
    "nystrom_attention",
    "segment_means",
    "softmax_attention",
    "to_hf",
    "to_long",
]
