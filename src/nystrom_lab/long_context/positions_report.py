"""The report of ``nystrom pretrain long-positions``: ``results.json``, ``results.md`` and the figures.

``results.json``:

- ``step0.{variant}.{mlm_acc, mlm_acc_by_bucket, mlm_loss}``: the screen (``source-512``: the source on
  512-token windows of the same dev tokens);
- ``variants.{name}.{final_mlm_acc, mlm_acc_by_bucket, tokens_seen, median_step_s, peak_mem_mb, attention,
  positions, ...}`` for the source and every trained variant (``window-512-continued`` among them), with
  their dev curves (every 25 steps, step 0 included);
- ``genre.{run}.test_acc``: one entry per seed (once the genre stage has run);
- ``targets.{variant}``: each finished long Nyström variant against ``window-512-continued``
  (:mod:`nystrom_lab.long_context.positions_targets`);
- ``within_document``: every scored variant by position within the document, against
  ``window-512-continued``, and what packing changed (:mod:`nystrom_lab.long_context.positions_packed`);
  a packed variant's ``tokens_seen`` and ``curves.tokens`` count real (non-padding) tokens;
- ``settings`` and ``machine``.
"""

from __future__ import annotations

import json

from nystrom_lab.long_context.positions import (
    ATTENTIONS,
    CONTINUED,
    SCHEMES,
    SOURCE,
    PositionsRun,
    attention_spec,
    log_scale,
    prepare_variant,
    split_variant,
)
from nystrom_lab.long_context.positions_packed import read_within, within_summary, within_tables
from nystrom_lab.long_context.positions_screen import SOURCE_WINDOWS, read_screen, screened_variants
from nystrom_lab.long_context.positions_targets import targets, targets_table
from nystrom_lab.long_context.probe import probe_in_child
from nystrom_lab.long_context.report import machine, summarise


def trained(run: PositionsRun) -> list[str]:
    """The variants with a training folder, the source and window-512-continued first."""
    names = (
        sorted(p.name for p in run.out.iterdir() if (p / "metrics.jsonl").is_file())
        if run.out.is_dir()
        else []
    )
    first = [n for n in (SOURCE, CONTINUED) if n in names]
    return first + [n for n in names if n not in first]


def describe(run: PositionsRun, variant: str) -> dict:
    """``attention`` and ``positions`` of a variant, as results.json records them."""
    if variant in (SOURCE, CONTINUED):
        return {"attention": "softmax", "positions": f"source ({run.source_length} rows)", "layout": "stream"}
    scheme, attention = split_variant(variant)
    positions, alpha = SCHEMES[scheme]
    return {
        "attention": attention_spec(attention, scale=log_scale(run, attention)),
        "positions": positions if alpha is None else f"{positions}, alpha {alpha}",
        "layout": run.layout(variant),
    }


def write_report(run: PositionsRun, *, probes: bool = True, genre: dict | None = None) -> dict:
    """Gather the screen and every trained variant into ``OUT/results.json``, ``results.md`` and
    ``curves.png``; probes already in an earlier results.json are kept unless ``probes``, and so is its
    ``genre`` unless a new one is given."""
    path = run.out / "results.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    report = {
        "settings": run.record(),
        "step0": read_screen(run),
        "variants": {},
        "genre": old.get("genre", {}) if genre is None else genre,
    }
    for variant in trained(run):
        v = summarise(run, variant)
        if not v:
            continue
        v["target_steps"] = run.variant_steps(variant)
        v.update(describe(run, variant))
        if v["layout"] == "documents":  # a packed row is part padding: count the real tokens
            # imported here: the budget replays the packing with numpy, which rendering the docs must not load
            from nystrom_lab.long_context.positions_budget import real_tokens

            *curve, v["tokens_seen"] = real_tokens(run, variant, [*v["curves"]["step"], v["steps"]])
            v["curves"]["tokens"] = curve
        finished = (run.out / variant / "results.json").is_file()
        kept = (old.get("variants", {}).get(variant) or {}).get("probe")
        if probes and finished and variant != SOURCE:
            prepare_variant(run, variant)  # its start (a fresh checkout has results, not weights)
            v["probe"] = probe_in_child(run, variant)
        else:
            v["probe"] = kept
        v["peak_mem_mb"] = v["probe"]["peak_mem_mb"] if v["probe"] else None
        report["variants"][variant] = v
    report["targets"] = targets(report)
    report["within_document"] = within_summary(read_within(run))
    report["machine"] = machine()
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if report["variants"]:
        plot_curves(run, report["variants"], run.out / "curves.png")
    if report["step0"]:
        plot_screen(report["step0"], run.out / "screen.png")
    (run.out / "results.md").write_text(tables(report))
    return report


def plot_curves(run: PositionsRun, variants: dict, png):
    """Dev MLM accuracy against tokens seen since MiniLM (continued runs start where the source's best step
    ended), and every variant's accuracy by position at its last evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = run.out / SOURCE / "results.json"
    best = (
        json.loads(res.read_text()).get("best_step", run.source_steps) if res.is_file() else run.source_steps
    )
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, v in variants.items():
        start = 0 if name == SOURCE else best * run.tokens_per_step
        seen = v["curves"].get("tokens") or [step * run.tokens_per_step for step in v["curves"]["step"]]
        xs = [(start + t) / 1e6 for t in seen]
        ax1.plot(xs, [100 * a for a in v["curves"]["mlm_acc"]], "o-", ms=3, label=name)
    ax1.set(xlabel="training tokens since MiniLM (M)", ylabel="dev MLM accuracy (%)",
            title="source at 512 tokens, then each variant (same dev tokens)")  # fmt: skip
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    buckets = _buckets(variants)
    width = 0.8 / max(1, len(variants))
    for i, (name, v) in enumerate(variants.items()):
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(buckets))]
        ax2.bar(
            xs,
            [100 * v["mlm_acc_by_bucket"][b] for b in buckets],
            width,
            label=f"{name} (step {v['final_step']})",
        )
    ax2.set_xticks(range(len(buckets)), buckets)
    ax2.set(
        xlabel="position in the 4096-token layout",
        ylabel="dev MLM accuracy (%)",
        title="at the last evaluation",
    )
    top = max(100 * v["mlm_acc_by_bucket"][b] for v in variants.values() for b in buckets)
    ax2.set_ylim(bottom=min(20.0, top - 10), top=top + 1.2 * len(variants))  # the legend above the bars
    ax2.grid(axis="y", alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def plot_screen(step0: dict, png):
    """Step-0 dev MLM accuracy of every scheme (groups) and attention (bars), the source as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schemes = [s for s in SCHEMES if any(k.startswith(s + "-") for k in step0)]
    attentions = [a for a in ATTENTIONS if any(k.endswith("-" + a) and k in step0 for k in step0)]
    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.8 / max(1, len(attentions))
    for i, a in enumerate(attentions):
        xs = [j + (i - (len(attentions) - 1) / 2) * width for j in range(len(schemes))]
        ys = [100 * step0.get(f"{s}-{a}", {}).get("mlm_acc", float("nan")) for s in schemes]
        ax.bar(xs, ys, width, label=a)
    if SOURCE_WINDOWS in step0:
        ax.axhline(
            100 * step0[SOURCE_WINDOWS]["mlm_acc"],
            color="k",
            ls="--",
            lw=1,
            label="source on 512-token windows",
        )
    ax.set_xticks(range(len(schemes)), schemes)
    ax.set(xlabel="position scheme (4096 rows from 512)", ylabel="dev MLM accuracy at step 0 (%)",
           title="converted from the MLM-trained source, no training")  # fmt: skip
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _buckets(entries: dict) -> list[str]:
    first = next(iter(entries.values()))["mlm_acc_by_bucket"]
    return sorted(first, key=lambda b: int(b[1:].split(",")[0]))


def tables(report: dict) -> str:
    """Markdown: the step-0 screen against the source, then the trained variants at equal tokens."""
    out = []
    step0 = report["step0"]
    if step0:
        buckets = _buckets(step0)
        src = step0.get(SOURCE_WINDOWS)
        head = ["variant (step 0)", "overall", *buckets, "[0, 512) vs source"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        order = [
            SOURCE_WINDOWS,
            *screened_variants(),
        ]  # results.json sorts its keys: back to the screen's order
        for name, v in sorted(
            step0.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)
        ):
            gap = (
                ""
                if src is None
                else f"{100 * (v['mlm_acc_by_bucket'][buckets[0]] - src['mlm_acc_by_bucket'][buckets[0]]):+.2f}"
            )
            cells = [
                name,
                f"{100 * v['mlm_acc']:.2f}",
                *(f"{100 * v['mlm_acc_by_bucket'][b]:.2f}" for b in buckets),
                gap,
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    first = [SOURCE, CONTINUED]
    variants = {
        k: v
        for k, v in sorted(
            report["variants"].items(),
            key=lambda kv: (kv[0] not in first, first.index(kv[0]) if kv[0] in first else 0),
        )
        if v
    }
    if variants:
        buckets = _buckets(variants)
        head = ["variant", "positions", "steps", "tokens", "step 0", "final", *buckets, "s/step (run)",
                "s/step (probe)", "peak MB (probe)"]  # fmt: skip
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, v in variants.items():
            cells = [name, v["positions"], f"{v['steps']}/{v['target_steps']}", f"{v['tokens_seen'] / 1e6:.2f} M",
                     f"{100 * v['initial_mlm_acc']:.2f}", f"{100 * v['final_mlm_acc']:.2f}",
                     *(f"{100 * v['mlm_acc_by_bucket'][b]:.2f}" for b in buckets),
                     f"{v['median_step_s']:.1f}" if v.get("median_step_s") else "-",
                     f"{v['probe']['median_step_s']:.1f}" if v.get("probe") else "-",
                     f"{v['peak_mem_mb']:.0f}" if v.get("peak_mem_mb") else "-"]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
    if report.get("targets"):
        out += ["", targets_table(report["targets"])]
    within = within_tables(report.get("within_document") or {})
    if within:
        out += ["", within]
    return "\n".join(out) + "\n" if out else "nothing measured yet\n"
