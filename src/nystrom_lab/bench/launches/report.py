"""Tables of ``nystrom bench launches``: ops per forward and forward + backward, ours vs
transformers' Nyströmformer, and a run against the committed "before" counts.

Torch-free on purpose: ``nystrom docs render`` rebuilds docs/gpu/launches.md from the committed JSON with
these same writers.
"""

from __future__ import annotations

#: rows of the tables, in order, with their descriptions
CASE_LABELS = {
    "module": "attention module, no mask",
    "module-mask": "attention module, mask of ones",
    "model-mask": "MiniLM-size model (6 layers), mask of ones",
}
PASSES = (("forward", "forward"), ("forward_backward", "fwd+bwd"))


def _ratio(ours: int, hf: int) -> str:
    return f"{ours / hf:.2f}×" if hf else "—"


def table(run: dict) -> str:
    """One run: per case and pass, our ops, HF's ops, ours ÷ HF, host syncs (ours / HF)."""
    out = [
        "| case | pass | ours ops | HF ops | ours ÷ HF | host syncs ours / HF |",
        "|---|---|---:|---:|---:|---|",
    ]
    for case, label in CASE_LABELS.items():
        ours, hf = run["cases"][case]["ours"], run["cases"][case]["hf"]
        for key, name in PASSES:
            o, h = ours[key], hf[key]
            out.append(
                f"| {label} | {name} | {o['ops']} | {h['ops']} | {_ratio(o['ops'], h['ops'])} | "
                f"{o['host_syncs']} / {h['host_syncs']} |"
            )
    return "\n".join(out)


def before_after(before: dict, after: dict) -> str:
    """Our ops before and after the launch work (HF's for reference), per case and pass."""
    out = [
        f"| case | pass | before ({before['commit']}) | after ({after['commit']}) | after ÷ before | HF | after ÷ HF |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for case, label in CASE_LABELS.items():
        for key, name in PASSES:
            b = before["cases"][case]["ours"][key]["ops"]
            a = after["cases"][case]["ours"][key]["ops"]
            hf = after["cases"][case]["hf"][key]["ops"]
            out.append(f"| {label} | {name} | {b} | {a} | {_ratio(a, b)} | {hf} | {_ratio(a, hf)} |")
    return "\n".join(out)


def top_ops(run: dict, *, case: str = "model-mask", side: str = "ours", limit: int = 12) -> str:
    """The most frequent ops of one case's forward + backward (where the launches go)."""
    by_op = run["cases"][case][side]["forward_backward"]["by_op"]
    cells = [f"{name} {count}" for name, count in list(by_op.items())[:limit]]
    return ", ".join(cells)


def render(run: dict) -> str:
    """The markdown report a run writes beside its JSON."""
    m = run["machine"]
    head = (
        f"Ops dispatched on the meta device (the accelerator path), n = {run['n']}, b = 1, float32; "
        f"commit {run['commit']}, torch {m['torch']}, transformers {m['transformers']}.\n"
    )
    syncs = {
        f"{case}/{side}": s
        for case, sides in run["cases"].items()
        for side, r in sides.items()
        if (s := r["forward_backward"]["sync_sites"])
    }
    tail = "\n\nHost syncs: " + (
        "; ".join(f"{k}: {', '.join(v)}" for k, v in syncs.items()) if syncs else "none"
    )
    return (
        head
        + "\n"
        + table(run)
        + f"\n\nOurs, MiniLM-size model, fwd+bwd, top ops: {top_ops(run)}"
        + tail
        + "\n"
    )
