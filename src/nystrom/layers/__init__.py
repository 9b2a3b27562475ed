"""Layer pieces below the attention modules and the models (as flash-linear-attention keeps ``modules/``
apart from ``ops/``): the feed-forward with its blocked backward (``ffn``), the linear + cross-entropy
head (``cross_entropy``), the conv skip (``conv``), LayerNorm with an export form (``norm``), dropout,
the oneDNN-fused linear (``dense`` over ``onednn``) and the joint q/k/v projection (``projection``). Each piece that has a CPU and an accelerator
implementation asks the device question in one function: ``ffn.row_blocks``, ``conv.conv_path``,
``projection.project_heads``."""
