"""nystrom: the Nyströmformer (Xiong et al., AAAI 2021) — O(n) Nyström self-attention for PyTorch.

``import nystrom`` imports nothing heavy: each public name loads its submodule (and torch/transformers)
on first use. Our models are registered with transformers' Auto classes as soon as transformers loads
them (see :mod:`nystrom._registration`), so ``AutoModel*.from_pretrained`` and ``pipeline`` read our folders.
"""

from typing import TYPE_CHECKING

from nystrom import _registration
from nystrom._lazy import lazy_attributes

__version__ = "0.1.0"

_MODEL = "nystrom.model"
_NAMES = {
    "functional": "nystrom.functional",
    "REGISTRY": "nystrom.attention",
    "NystromAttention": "nystrom.attention",
    "SoftmaxAttention": "nystrom.attention",
    "nystrom_attention": "nystrom.functional",
    "segment_means": "nystrom.functional",
    "softmax_attention": "nystrom.functional",
    **dict.fromkeys(
        ("NystromformerConfig", "NystromformerForMaskedLM", "NystromformerForSequenceClassification",
         "NystromformerModel", "convert_legacy_checkpoint", "from_bert", "from_hf", "from_roberta", "to_hf",
         "to_long"),
        _MODEL,
    ),
}  # fmt: skip
__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
__all__ = sorted([*_NAMES, "__version__"])

_registration.install()

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from nystrom import functional
    from nystrom.attention import REGISTRY, NystromAttention, SoftmaxAttention
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
