"""Markdown of ``python -m nystrom_lab.bench.packing`` (packed vs padded pre-training rows), torch-free.

A row of ``results["rows"]``: ``max_length``, ``layout``, ``rows`` and ``tokens`` (real) per epoch,
``padding_share``, and from the timed steps ``rows_per_step``, ``step_ms`` (median), ``tokens_per_s``
(median of real tokens / step seconds), ``speedup`` (median over rounds of this layout's tokens/s over
the padded layout's), or ``error`` when the layout could not be timed.
"""

from __future__ import annotations

HEAD = (
    "| L | layout | rows / epoch | real tokens / epoch | padding | rows / step | ms / step | real tokens/s |"
    " vs padded |"
)


def _timed(r: dict) -> str:
    if "error" in r:
        return f" {r['rows_per_step']} | not timed: {r['error']} | | |"
    speed = f"{r['speedup']:.2f}×" if r.get("speedup") is not None else "1.00×"
    return f" {r['rows_per_step']} | {r['step_ms']:,.0f} | {r['tokens_per_s']:,.0f} | {speed} |"


def render(results: dict) -> str:
    """The table, one line per (L, layout), and a line naming the machine, model and command."""
    out = [HEAD, "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["rows"]:
        out.append(
            f"| {r['max_length']} | {r['layout']} | {r['rows']:,} | {r['tokens']:,} | {100 * r['padding_share']:.1f} % |"
            + _timed(r)
        )
    m, s = results["machine"], results["settings"]
    out.append("")
    out.append(
        f"The training split of {s['corpus']} ({s['corpus_documents']} documents, 5 % held out), model {s['model']};"
        f" {s['rounds']} interleaved"
        f" rounds after {s['warmup']} warm-up; {m.get('cpu', '?')}, {m.get('threads', '?')} threads, torch"
        f" {m.get('torch', '?')}. `{results['command']}`"
    )
    return "\n".join(out) + "\n"


#: the layouts of ``python -m nystrom_lab.bench.packing.cost``, in table order
COST_LAYOUTS = ("one document", "Brown mix", "4 equal", "16 equal", "64 equal")


def cost_table(record: dict) -> str:
    """``python -m nystrom_lab.bench.packing.cost``'s record as a table: ms and the ratio to one document,
    per n and mode, and a line naming the machine."""
    lines = ["| n | mode | " + " | ".join(COST_LAYOUTS) + " |", "|---|---|" + "---|" * len(COST_LAYOUTS)]
    for row in record["rows"]:
        base = row["ms"]["one document"]
        cells = [f"{row['ms'][k]:.1f} ms ({row['ms'][k] / base:.2f}×)" for k in COST_LAYOUTS]
        lines.append(f"| {row['n']} | {row['mode']} | " + " | ".join(cells) + " |")
    m = record["machine"]
    lines += [
        "",
        f"{m.get('cpu', '?')}, {record['threads']} threads, torch {m.get('torch', '?')}; medians of interleaved rounds.",
    ]
    return "\n".join(lines) + "\n"
