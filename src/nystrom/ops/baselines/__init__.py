"""The other efficient attentions of the paper's comparisons, one file each: ``linear`` (ELU linear
attention), ``linformer``, ``longformer`` (sliding window), ``performer`` (FAVOR+) and ``reformer`` (LSH).

One folder for all, not one each: every baseline is a single plain implementation with no device branch
and no separate reference (the tests hold their float64 oracles), so a folder of its own would hold one
file."""
