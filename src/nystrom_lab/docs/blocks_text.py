"""Blocks of docs/pretraining.md, docs/fig5_scratch_with_noconv.md and docs/long-context.md: the text
experiments' tables, from their committed run folders under experiments/ and the experiments' own writers.

Legend: MLM masked-LM, SOP sentence-order prediction; a *variant* is one attention trained alike.
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.data.records import median_step_s, read_metrics
from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import dev_records, percent, read_json
from nystrom_lab.long_context import genre
from nystrom_lab.long_context.experiment import ORDER
from nystrom_lab.long_context.report import table as long_context_table
from nystrom_lab.text.curves import curves_of, curves_table, dev_summary

SCRATCH, NOCONV, WARMUP = (
    "experiments/fig5-scratch",
    "experiments/fig5-ablation-noconv",
    "experiments/fig5-warmup10",
)
LONG = "experiments/long-context"
FIG5 = ("softmax", "nystrom-64", "linformer-256", "linear")
#: Figure 5 from scratch, with the conv-less ablation last: (label in the tables, metrics log)
CURVES = (
    *((v, f"{SCRATCH}/{v}/metrics.jsonl") for v in FIG5),
    ("nystrom-64 no conv", f"{NOCONV}/nystrom-64/metrics.jsonl"),
)
#: the logs of the conv-less ablation's table, in its row order
NOCONV_LOGS = (*(f"{SCRATCH}/{v}/metrics.jsonl" for v in ("softmax", "linformer-256", "linear")),
               f"{NOCONV}/nystrom-64/metrics.jsonl", f"{SCRATCH}/nystrom-64/metrics.jsonl")  # fmt: skip
LABELS = {"nystrom-64": "nystrom-64 (conv 65)", "linear": "linear (elu + 1)"}
#: the runs that ran with glibc keeping freed memory (about 5 % faster steps; footnote ¹ of the doc)
CACHED_MALLOC = ("nystrom-64", "linformer-256", "linear", "ablation")


def fig5_curves(*logs: Path) -> str:
    """Every dev value of Figure 5 from scratch and the conv-less ablation (the figure's data)."""
    return curves_table({label: curves_of(dev_records(p)) for (label, _), p in zip(CURVES, logs)})


def _row(label: str, s: dict, steps: str, final: str, note: str) -> str:
    """A variant's row; ``note`` says whether it gets the allocator footnote."""
    mark = " ¹" if note in CACHED_MALLOC else ""
    return (f"| {label} | {steps} | {final} | {percent(s['best_mlm_accuracy'], 2)} ({s['best_step']}) | "
            f"{percent(s['final_sop_accuracy'])} / {percent(s['best_sop_accuracy'])} | {s['median_step_s']:.2f}{mark} |")  # fmt: skip


def fig5_scratch(results: Path, ablation_log: Path, ablation_config: Path) -> str:
    """Per variant: steps, final and best dev MLM accuracy, SOP, median step time; the ablation last."""
    variants = read_json(results)["variants"]
    best = max(variants, key=lambda v: variants[v]["final_mlm_accuracy"])
    out = ["| variant | steps | final dev MLM acc | best (step) | dev SOP acc (final / best) | median s / step |",
           "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for v, s in variants.items():
        final = percent(s["final_mlm_accuracy"], 2)
        out.append(_row(LABELS.get(v, v), s, str(s["steps"]), f"**{final}**" if v == best else final, v))
    recs = read_metrics(ablation_log)
    train = [r for r in recs if r["split"] == "train"]
    s = {**dev_summary([r for r in recs if r["split"] == "dev"]), "median_step_s": median_step_s(train)}
    steps = f"{max(r['step'] for r in train)} of {read_json(ablation_config)['steps']}"
    final = f"{percent(s['final_mlm_accuracy'], 2)} (at {s['final_dev_step']})"
    out.append(_row("*ablation:* nystrom-64 without conv", s, steps, final, "ablation"))
    return "\n".join(out)


def _at_steps(steps: tuple[int, ...], rows: list[tuple[str, Path]]) -> str:
    """Dev MLM accuracy of each (label, log) at the given steps."""
    out = ["| dev MLM acc at step | " + " | ".join(map(str, steps)) + " |", "|---|" + "---:|" * len(steps)]
    for label, log in rows:
        acc = {r["step"]: r["mlm_accuracy"] for r in dev_records(log)}
        out.append(f"| {label} | " + " | ".join(percent(acc[s]) for s in steps) + " |")
    return "\n".join(out)


def noconv_steps(softmax: Path, linformer: Path, linear: Path, noconv: Path, nystrom: Path) -> str:
    """The conv-less Nyström against softmax, Linformer and linear, and Nyström with its conv."""
    labels = ("softmax", "linformer-256", "linear", "nystrom-64 without conv", "nystrom-64 (conv 65)")
    return _at_steps(
        (300, 500, 800, 1000, 1200), list(zip(labels, (softmax, linformer, linear, noconv, nystrom)))
    )


def warmup(softmax: Path, softmax10: Path, nystrom: Path, nystrom10: Path) -> str:
    """Warm-up over 2 % of the steps (the runs above) against 10 % (experiments/fig5-warmup10)."""
    labels = (
        "softmax, warm-up 2 %",
        "softmax, warm-up 10 %",
        "nystrom-64 (conv 65), warm-up 2 %",
        "nystrom-64 (conv 65), warm-up 10 %",
    )
    return _at_steps((200, 300, 500, 800), list(zip(labels, (softmax, softmax10, nystrom, nystrom10))))


def long_context(results: Path) -> str:
    """The long-context variants (the experiment's own table), slowest first as the experiment runs them."""
    report = read_json(results)
    report["variants"] = {v: report["variants"][v] for v in ORDER if v in report["variants"]}
    return long_context_table(report)


def fidelity(results: Path) -> str:
    """Step-0 cosine of the converted models' last hidden states to MiniLM's: mean (minimum)."""
    cos = read_json(results)["fidelity"]["cosine"]
    out = ["| | 512 tokens fed alone | as the start of a 4096-token input |", "|---|---|---|"]
    for v in (v for v in ORDER if v in cos):
        cells = [f"{cos[v][k]['mean']:.3f} ({cos[v][k]['min']:.3f})" for k in ("alone_512", "start_of_4096")]
        out.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def positions(results: Path) -> str:
    """The position-schemes experiment's screen and equal-budget runs (the experiment's own tables)."""
    from nystrom_lab.long_context.positions_report import tables

    return tables(read_json(results)).rstrip("\n")


def genres(results: Path) -> str:
    """The genre fine-tuning runs (the experiment's own table, paired comparisons included)."""
    return genre.render(read_json(results))


BLOCKS = [
    Block("docs/fig5_scratch_with_noconv.md", "fig5-curves", tuple(p for _, p in CURVES), fig5_curves),
    Block("docs/pretraining.md", "fig5-scratch", (f"{SCRATCH}/results.json", f"{NOCONV}/nystrom-64/metrics.jsonl",
                                                   f"{NOCONV}/nystrom-64/train_config.json"), fig5_scratch),
    Block("docs/pretraining.md", "fig5-noconv", NOCONV_LOGS, noconv_steps),
    Block("docs/pretraining.md", "fig5-warmup", tuple(f"{run}/{v}/metrics.jsonl" for v in ("softmax", "nystrom-64") for run in (SCRATCH, WARMUP)), warmup),
    Block("docs/long-context.md", "long-context-results", (f"{LONG}/results.json",), long_context),
    Block("docs/long-context.md", "long-context-fidelity", (f"{LONG}/results.json",), fidelity),
    Block("docs/long-context.md", "long-context-genre", (f"{LONG}/genre/results.json",), genres),
    Block("docs/long-context.md", "long-positions", (f"{LONG}/positions/results.json",), positions),
]  # fmt: skip
