"""nystrom: the Nyströmformer (Xiong et al., AAAI 2021) — O(n) Nyström self-attention for PyTorch."""

from nystrom import functional
from nystrom.attention import REGISTRY, NystromAttention, SoftmaxAttention
from nystrom.functional import nystrom_attention, segment_means, softmax_attention
from nystrom.model import from_bert, from_hf

__version__ = "0.1.0"

__all__ = [
    "REGISTRY",
    "NystromAttention",
    "SoftmaxAttention",
    "__version__",
    "from_bert",
    "from_hf",
    "functional",
    "nystrom_attention",
    "segment_means",
    "softmax_attention",
]
