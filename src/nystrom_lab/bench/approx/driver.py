"""Approximation quality: relative error of each attention variant against exact softmax attention.

Legend: h heads, n tokens, d head dim, m budget (landmarks, projected length, window, features,
2×bucket), N tokens of the whole text.

:func:`run` sweeps every method and budget m over two input families, ``minilm`` (q, k, v of a MiniLM
layer on English text, n in ``TEXT_LENGTHS``) and ``lowrank`` (synthetic low-rank-plus-noise, n in
``SYNTH_LENGTHS``), and writes approx.csv/.md/.png, the paper's Figure 3 maps (exact vs Nyström
attention matrix) and its section of benchmarks.md. The protocol, the methods' budgets, the inputs and
the error measure are in :mod:`nystrom_lab.bench.approx.relative_error` (its public names are re-exported here).
"""

from __future__ import annotations

import csv
import inspect
import json
import math
from pathlib import Path

import torch

from nystrom.attention import NystromAttention
from nystrom.functional import nystrom_factors
from nystrom_lab.bench.approx.relative_error import (  # noqa: F401 (re-exported: callers import them from here)
    METHODS,
    PARAMS,
    WINDOW,
    approximate,
    default_text,
    lowrank_qkv,
    minilm_qkv,
    relative_error,
    shared_qk_attention,
    sweep,
)
from nystrom_lab.bench.approx.report import plot, render, report  # noqa: F401 (re-exported)
from nystrom_lab.bench.measure import replace_section

TEXT_LENGTHS = (256, 512, 1024, 2048)
SYNTH_LENGTHS = (512, 1024, 2048, 4096)



def run(
    *,
    text_lengths: tuple[int, ...] = TEXT_LENGTHS,
    synth_lengths: tuple[int, ...] = SYNTH_LENGTHS,
    params: tuple[int, ...] = PARAMS,
    methods: tuple[str, ...] = METHODS,
    trials: int = 3,
    layer: int = 2,
    text: Path | None = None,
    fig_n: int = 512,
    fig_head: int = 0,
    fig_m: int | None = None,
    seed: int = 0,
    out_dir: Path = Path("runs/approx"),
    markdown: Path | None = Path("runs/approx/benchmarks.md"),
    command: str = "nystrom approx",
) -> list[dict]:
    """Both families over their lengths; writes approx.csv/.md/.png and approx_attention_maps.png. ``fig_m``
    None: NystromAttention's default landmarks, which the tables also focus on."""
    from tqdm import tqdm

    from nystrom_lab.bench.plots import plot_attention_maps

    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"methods: unknown {bad}; choose from {list(METHODS)}")
    text = default_text() if text is None else text
    q, k, v = minilm_qkv(layer=layer, text=text)  # (1, 12, N, 32)
    total = q.shape[2]
    if max(text_lengths) > total:
        raise ValueError(f"--text-lengths: {text} gives {total} tokens, fewer than n={max(text_lengths)}")
    if not 0 <= fig_head < q.shape[1] or fig_n > total:
        raise ValueError(f"--fig-head must be in [0, {q.shape[1]}) and --fig-n <= {total}")
    jobs = [("minilm", n) for n in sorted(text_lengths)] + [("lowrank", n) for n in sorted(synth_lengths)]
    rows: list[dict] = []
    for family, n in tqdm(jobs, desc="approx", unit="n"):
        x = (q[:, :, :n], k[:, :, :n], v[:, :, :n]) if family == "minilm" else lowrank_qkv(n, seed=seed)
        rows += sweep(family, *x, methods=methods, params=params, trials=trials, seed=seed)
    default_m = inspect.signature(NystromAttention).parameters["num_landmarks"].default
    fig_m = default_m if fig_m is None else fig_m
    out_dir.mkdir(parents=True, exist_ok=True)
    fields = ["family", "n", "method", "param", "rel_err", "rel_err_std", "reference", "logit_std"]
    with open(out_dir / "approx.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    plot(rows, out_dir / "approx.png")

    qh, kh = q[:, fig_head : fig_head + 1, :fig_n], k[:, fig_head : fig_head + 1, :fig_n]  # (1, 1, n, d)
    exact = torch.softmax(qh @ kh.mT / math.sqrt(qh.shape[-1]), -1)[0, 0]  # (n, n)
    f_, z, b_ = nystrom_factors(qh, kh, num_landmarks=fig_m)
    approx = (f_ @ z @ b_)[0, 0]  # (n, n)
    fig_err = relative_error(approx, exact)
    plot_attention_maps(
        exact,
        approx,
        out_dir / "approx_attention_maps.png",
        title=f"MiniLM layer {layer}, head {fig_head}, first {fig_n} tokens of {text.name}, m={fig_m}: "
        f"relative Frobenius error {fig_err:.3f}",
    )
    # the run record: with the CSV's rows, all that `nystrom docs render` needs to rebuild the report
    record = {"command": command, "trials": trials, "layer": layer, "text": text.name, "fig_n": fig_n,
              "fig_head": fig_head, "fig_m": fig_m, "fig_err": fig_err}  # fmt: skip
    (out_dir / "approx.json").write_text(json.dumps(record, indent=1) + "\n")
    body = report(rows, record)
    print(body)
    (out_dir / "approx.md").write_text(body + "\n")
    if markdown is not None:
        replace_section(markdown, "approx", body)
    return rows
