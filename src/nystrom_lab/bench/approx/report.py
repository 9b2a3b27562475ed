"""Markdown report of ``nystrom approx`` (see :mod:`nystrom_lab.bench.approx.driver`).

Legend: n tokens, m the method's budget (landmarks, projection length, window, features, bucket keys).

Torch-free on purpose: ``nystrom docs render`` rebuilds the report from the committed ``approx.csv``
(rows) and ``approx.json`` (the run's options and Figure 3's error) with this same writer.
"""

from __future__ import annotations

from pathlib import Path


def render(rows: list[dict], *, family: str, focus: int) -> str:
    """Two markdown tables for one family: error vs m at the largest n, and error vs n at m = ``focus``."""
    sub = [r for r in rows if r["family"] == family]
    if not sub:
        return ""
    get = {(r["method"], r["n"], r["param"]): r["rel_err"] for r in sub}
    methods = list(dict.fromkeys(r["method"] for r in sub))
    lengths = sorted({r["n"] for r in sub})
    n_max = lengths[-1]
    params = sorted({r["param"] for r in sub if r["n"] == n_max and r["method"] != "uniform"})

    def cell(method: str, n: int, m: int) -> str:
        err = get.get((method, n, 0 if method == "uniform" else m))
        return "—" if err is None else f"{err:.3f}"

    lines = [f"Relative error vs m, {family}, n={n_max}:", ""]
    lines += ["| method | " + " | ".join(f"m={m}" for m in params) + " |", "|---|" + "---:|" * len(params)]
    lines += [f"| {me} | " + " | ".join(cell(me, n_max, m) for m in params) + " |" for me in methods]
    lines += ["", f"Relative error vs n, {family}, m={focus}:", ""]
    lines += ["| method | " + " | ".join(f"n={n}" for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    lines += [f"| {me} | " + " | ".join(cell(me, n, focus) for n in lengths) + " |" for me in methods]
    return "\n".join(lines)


def focus_param(params: list[int] | tuple[int, ...]) -> int:
    """The budget the error-vs-n tables are shown at: the one nearest the paper's m = 64."""
    return min(params, key=lambda p: abs(p - 64))


def plot(rows: list[dict], png: Path) -> None:
    """Error against the budget at each family's largest n (the run's ``approx.png``)."""
    from nystrom_lab.bench.plots import plot_approx

    names = dict.fromkeys(r["family"] for r in rows)  # minilm, then lowrank: the order they were measured in
    plot_approx(rows, png, families=[(fam, max(r["n"] for r in rows if r["family"] == fam)) for fam in names])


def report(rows: list[dict], run: dict) -> str:
    """The whole section: what was measured, both families' tables, the figures and Figure 3's error.

    ``run``: ``command``, ``trials``, ``layer``, ``text`` (file name), ``fig_n``, ``fig_head``, ``fig_m``
    and ``fig_err`` (relative Frobenius error of the Figure 3 maps)."""
    focus = focus_param(sorted({r["param"] for r in rows if r["method"] != "uniform"}))
    stds = {fam: next(r["logit_std"] for r in rows if r["family"] == fam) for fam in ("minilm", "lowrank")}
    return "\n".join(
        [
            f"Command: `{run['command']}`",
            "",
            "Same q, k, v for every method (functional forms, no projections); error ‖Ŷ−Y‖_F/‖Y‖_F vs exact "
            "softmax attention (Reformer: vs exact shared-QK attention), mean over "
            f"{run['trials']} draws for the random methods. m = landmarks (Nyström), projected length (Linformer, "
            "untrained E/F; `linformer-pool`: E = F = segment means), window−1 (Longformer), random features (Performer), 2×bucket size (Reformer, "
            "2 hashes). `uniform` = mean of v, the no-information floor.",
            f"minilm: all-MiniLM-L6-v2 layer {run['layer']} (h=12, d=32) on `{run['text']}` in 512-token windows, "
            f"logit std {stds['minilm']:.2f}; lowrank: 4 heads × 64, rank 8 latents, noise 0.3, "
            f"logit std {stds['lowrank']:.2f}.",
            "",
            render(rows, family="minilm", focus=focus),
            "",
            render(rows, family="lowrank", focus=focus),
            "",
            "![error vs m](approx.png) — data: `approx.csv`.",
            "",
            f"Figure 3 (paper): exact softmax matrix vs Nyström F·A⁺·B, MiniLM layer {run['layer']}, head "
            f"{run['fig_head']}, n={run['fig_n']}, m={run['fig_m']}, relative Frobenius error {run['fig_err']:.3f}:",
            "",
            "![exact vs Nyström attention](approx_attention_maps.png)",
        ]
    )
