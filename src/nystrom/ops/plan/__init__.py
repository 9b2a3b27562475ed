"""The per-forward token plan that every attention variant shares: which tokens are real (``mask``), which
document each belongs to (``cu_seqlens``; transformers' forms of it become it in :mod:`.forms`), and the
memo that computes what they determine once per forward for all layers (:func:`shared_plan`). Nyström's
landmarks, the fused kernels' plan, softmax attention and the modules all read them from here."""

from nystrom.ops.plan.documents import (
    Documents,
    check_cu_seqlens,
    check_documents,
    document_plan,
    is_packed,
    packed_plan,
    token_documents,
)
from nystrom.ops.plan.forms import (
    cu_seqlens_from_document_ids,
    document_ids_from_positions,
    packed_cu_seqlens,
)
from nystrom.ops.plan.rows import (
    from_documents,
    rows_from_documents,
    run_packed,
    split_documents,
    to_documents,
)
from nystrom.ops.plan.shared import adopt, padding, shared, shared_plan

__all__ = [
    "Documents",
    "adopt",
    "check_cu_seqlens",
    "check_documents",
    "cu_seqlens_from_document_ids",
    "document_ids_from_positions",
    "document_plan",
    "from_documents",
    "is_packed",
    "packed_cu_seqlens",
    "packed_plan",
    "padding",
    "rows_from_documents",
    "run_packed",
    "shared",
    "shared_plan",
    "split_documents",
    "to_documents",
    "token_documents",
]
