"""FLOP floors: the time a computation's GEMM FLOPs would take at the large-GEMM rate measured on the
same machine, beside the case (the lower bound a figure is compared with, ``time ÷ floor``).

Legend: b batch, n tokens, h heads, d head dim, e = h·d model width, m landmarks, K conv kernel, f FFN
width, v vocabulary.

Each floor counts a different computation, so each has its own name; the conversion from FLOPs to time
is :func:`ms_at_rate`. Torch-free: ``nystrom docs render`` rebuilds the reports from committed JSON.
"""

from __future__ import annotations

#: the fraction of positions an MLM training step predicts (``nystrom bench models``' training mode)
MASK_FRACTION = 0.15


def ms_at_rate(flops: float, gflops: float) -> float:
    """Milliseconds ``flops`` take at ``gflops`` GFLOP/s."""
    return flops / (gflops * 1e9) * 1e3


def attention_core_floor_ms(n: int, *, landmarks: int, dim_head: int, heads: int, gflops: float) -> float:
    """The Nyström core's forward (``nystrom bench core``): 8·n·m·d·h FLOPs, four n×m×d GEMMs per head."""
    return ms_at_rate(8 * n * landmarks * dim_head * heads, gflops)


def attention_layer_training_floor_ms(regime: dict, n: int, gflops: float) -> float:
    """Our whole attention layer's forward + backward (``nystrom bench training``): projections 24·n·e²,
    core 28·n·m·e, conv 6·K·n·e, and the m×m part 144·m³·h.

    Projections (q/k/v and output): 8·n·e² forward, twice that backward (input and weight gradients).
    Core: 4 n×m×d GEMMs forward (8·n·m·d per head), 10 backward (two recomputed score products, and
    dV, dP, dQ, dK for each of the two softmax kernels: 20·n·m·d). The iterative pseudo-inverse: 6
    iterations of 4 m×m products (48·m³ per head forward, twice that backward); negligible at m = 64
    (0.3 GFLOP), a fifth of the floor at TransMIL's m = 256 (19 GFLOP), and the same for every
    implementation of the method. ``regime``: h, d, m, conv (K or None).
    """
    e, m, k, h = regime["h"] * regime["d"], regime["m"], regime["conv"] or 0, regime["h"]
    return ms_at_rate(24 * n * e * e + 28 * n * m * e + 6 * k * n * e + 144 * m**3 * h, gflops)


def model_floor_flops(size: dict, *, n: int, batch: int, mode: str, m: int = 64) -> float:
    """FLOPs of our Nyström model's GEMMs (``nystrom bench models``): per layer the q/k/v/out projections
    (4e²) and the FFN (2ef) at every token, the Nyström core (≈ 8·n·m·d per head, e = h·d) and, for
    training, the MLM head at the masked positions; a training step is 3× the forward (backward = 2×
    forward)."""
    e, f, v = size["hidden"], size["ffn"], size["vocab"]
    per_token = size["layers"] * (2 * (4 * e * e + 2 * e * f) + 8 * m * e)
    fwd = batch * n * per_token
    if mode == "inference":
        return fwd
    head = batch * n * MASK_FRACTION * 2 * (e * e + e * v)
    return 3 * (fwd + head)
