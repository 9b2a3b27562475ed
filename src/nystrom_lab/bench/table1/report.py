"""Markdown report of the paper's Table 1 (``nystrom bench``, see :mod:`nystrom_lab.bench.table1.driver`).

Legend: b batch, h heads, n tokens, d head dim, e = h·d model width.

Torch-free on purpose: ``nystrom docs render`` rebuilds the report from the committed ``table1_fwd.csv``
(rows) and ``table1_fwd.json`` (the run's setting and machine) with this same writer.
"""

from __future__ import annotations

from pathlib import Path

#: key -> (label as in the paper, registry name or "transformer", constructor options)
METHODS: dict[str, tuple[str, str, dict]] = {
    "transformer": ("Transformer", "transformer", {}),
    "sdpa": ("SDPA (fused exact)", "softmax", {}),
    "linformer-256": ("Linformer-256", "linformer", {"proj_len": 256}),
    "longformer-257": ("Longformer-257", "longformer", {"window_size": 257}),
    "nystrom-64": ("Nyströmformer-64", "nystrom", {"num_landmarks": 64, "conv_kernel_size": None}),
    "nystrom-32": ("Nyströmformer-32", "nystrom", {"num_landmarks": 32, "conv_kernel_size": None}),
    "nystrom-64-pytorch": ("Nyströmformer-64, PyTorch path", "nystrom-pytorch", {"num_landmarks": 64, "conv_kernel_size": None}),
    "performer-256": ("Performer-256", "performer", {"num_features": 256}),
    "reformer-2": ("Reformer-2", "reformer", {"n_hashes": 2, "bucket_size": 64}),
    # outside our registry (nystrom_lab.bench.table1.outside_modules): not run unless asked for
    "hf-nystrom-64": ("transformers Nyströmformer-64", "hf-nystromformer", {"num_landmarks": 64}),
    "lucidrains-64": ("lucidrains Nyström-64", "lucidrains", {"num_landmarks": 64, "pinv_iterations": 6, "residual": False}),
    "transmil": ("TransMIL layer (ours, m=256)", "transmil", {}),
    "transmil-lucidrains": ("TransMIL layer (lucidrains, m=256)", "transmil-lucidrains", {}),
}  # fmt: skip
#: the methods ``nystrom bench table1`` runs by default (ours and the paper's baselines)
DEFAULT_METHODS = ("transformer", "sdpa", "linformer-256", "longformer-257", "nystrom-64", "nystrom-32",
                   "performer-256", "reformer-2")  # fmt: skip
PAPER_NOTE = (
    "Paper (1080Ti GPU, forward): Nyströmformer-64 vs Transformer 11.5× memory / 5.6× time at n=4096 and "
    "22.8× / 12.7× at n=8192; vs Longformer-257 at n=8192 1.2× memory, 3× time."
)


def num(x: float) -> str:
    """A time or memory cell: three significant digits (``0.21``, ``18.9``, ``268``)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _ratio(ref: float | None, val: float) -> str:
    """The Transformer's value over this one, e.g. `` (22.8×)`` (empty without a Transformer case)."""
    if ref is None or val <= 0:
        return ""
    r = ref / val
    return f" ({r:.1f}×)" if r >= 0.95 else f" ({r:.2f}×)"


def render(rows: list[dict]) -> str:
    """The paper's layout: one row per method, per n a memory (MB) and a time (ms) cell, each with its
    ratio to the Transformer at that n, e.g. ``450 (22.8×)``; ``skip``/``error`` cells are footnoted."""
    lengths = sorted({r["n"] for r in rows})
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    get = {(r["method"], r["n"]): r for r in rows}
    head = ["self-attention"] + [f"{n} {unit}" for n in lengths for unit in ("MB", "ms")]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    notes: list[str] = []
    for m in methods:
        cells = [METHODS[m][0]]
        for n in lengths:
            r, ref = get.get((m, n), {}), get.get(("transformer", n), {})
            if "ms" not in r:
                why = r.get("skipped") or r.get("error") or "not run"
                notes.append(f"{METHODS[m][0]} at n={n}: {why}")
                cells += ["skip" if "skipped" in r else "error"] * 2
                continue
            cells.append(num(r["peak_mb"]) + _ratio(ref.get("peak_mb"), r["peak_mb"]))
            cells.append(num(r["ms"]) + _ratio(ref.get("ms"), r["ms"]))
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", *(f"- {t}" for t in notes)]
    return "\n".join(lines)


def setting(run: dict) -> str:
    """The setting line of a run record (``table1.run``'s ``table1_<mode>.json``)."""
    forked = "" if run["fresh_process"] else " forked from one worker that imported torch once"
    return (
        f"b={run['batch']}, h={run['heads']}, d={run['dim_head']} (e={run['heads'] * run['dim_head']}), "
        f"{run['dtype']}, {run['device']}, "
        f"{'forward + backward of out.sum()' if run['backward'] else 'forward under no_grad'}, conv skip off, "
        f"{run['repeats']} timed calls (median), each case in a fresh process{forked}; "
        f"{run['seconds']:.0f} s in all; 1-min load average {run['load_start']:.2f} at the start, "
        f"{run['load_end']:.2f} at the end (timings are only meaningful on an otherwise idle machine)."
    )


def plot(rows: list[dict], run: dict, png: Path) -> None:
    """Time and memory against n, one line per method (the run's ``table1_<mode>.png``)."""
    from nystrom_lab.bench.plots import plot_table1

    plot_table1(rows, png, title=setting(run).split(", each case")[0])


def report(rows: list[dict], run: dict) -> str:
    """The whole section: command, setting, machine, the table and the figure's link."""
    info, mode = run["info"], "fwdbwd" if run["backward"] else "fwd"
    return "\n".join(
        [
            f"Command: `{run['command']}`",
            "",
            f"Setting: {setting(run)}",
            f"Machine: {info['cpu']}, {info['threads']} threads, {info['platform']}; torch {info['torch']}, "
            f"Python {info['python']}.",
            "Cells: memory MB (Transformer / method) and time ms (Transformer / method); "
            "memory = peak above the level before the call (input and weights excluded).",
            PAPER_NOTE,
            "",
            render(rows),
            "",
            f"![time and memory vs n](table1_{mode}.png) — data: `table1_{mode}.csv`.",
        ]
    )
