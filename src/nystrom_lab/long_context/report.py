"""The long-context experiment's report: ``results.json``, the figure, the step-0 fidelity of the
conversion and each variant's training-step cost (time, peak memory) measured in a process of its own.

Legend: b batch, L training length, e hidden size.

``results.json``: ``{"settings": ..., "fidelity": ..., "variants": {name: {...}}}``; per variant
``initial_mlm_acc`` / ``final_mlm_acc`` (fractions, all dev positions), ``initial_mlm_loss`` /
``final_mlm_loss`` (nats per masked token), ``mlm_acc_by_bucket`` / ``mlm_loss_by_bucket`` (bucket label
-> value, at the end) and their ``initial_`` twins, ``curves`` (dev accuracy and loss per evaluated step),
``tokens_seen``, ``steps``, ``median_step_s`` (from the training log, evaluation intervals left out),
``probe`` (fresh-process step time and ``peak_mem_mb``) and ``peak_mem_mb``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from nystrom_lab.data.records import METRICS_LOG, environment, median_step_s, read_metrics
from nystrom_lab.long_context.experiment import VARIANTS, LongContextRun
from nystrom_lab.long_context.probe import probe_in_child

_PREFIX = "mlm_accuracy@"


def _bucket_label(key: str) -> str:
    lo, hi = key.split("@", 1)[1].split("-")
    return f"[{lo}, {hi})"


def _by_bucket(rec: dict, metric: str) -> dict[str, float]:
    keys = sorted(
        (k for k in rec if k.startswith(metric + "@")), key=lambda k: int(k.split("@")[1].split("-")[0])
    )
    return {_bucket_label(k): rec[k] for k in keys}


def summarise(run: LongContextRun, variant: str) -> dict:
    """One variant's figures from its metrics log (empty dict when it has not started)."""
    folder = run.out / variant
    recs = read_metrics(folder / METRICS_LOG, missing_ok=True)
    dev = [r for r in recs if r["split"] == "dev"]
    train = [r for r in recs if r["split"] == "train"]
    if not dev:
        return {}
    first, last = dev[0], dev[-1]
    length = run.length(variant)
    steps = train[-1]["step"] if train else 0
    out = {
        "length": length, "batch_size": run.tokens_per_step // length, "steps": steps,
        "target_steps": run.steps, "finished": (folder / "results.json").is_file(),
        "initial_step": first["step"], "final_step": last["step"],
        "initial_mlm_acc": first["mlm_accuracy"], "final_mlm_acc": last["mlm_accuracy"],
        "initial_mlm_loss": first["mlm_loss"], "final_mlm_loss": last["mlm_loss"],
        "initial_mlm_acc_by_bucket": _by_bucket(first, "mlm_accuracy"),
        "mlm_acc_by_bucket": _by_bucket(last, "mlm_accuracy"),
        "initial_mlm_loss_by_bucket": _by_bucket(first, "mlm_loss"),
        "mlm_loss_by_bucket": _by_bucket(last, "mlm_loss"),
        "curves": {"step": [r["step"] for r in dev], "mlm_acc": [r["mlm_accuracy"] for r in dev],
                   "mlm_loss": [r["mlm_loss"] for r in dev]},
        "tokens_seen": steps * run.tokens_per_step,  # every piece is full but one per epoch (< 0.1 % short)
        "median_step_s": median_step_s(train, eval_steps={r["step"] for r in dev}),
    }  # fmt: skip
    return out


def fidelity(run: LongContextRun, *, windows: int = 4) -> dict:
    """Step-0 fidelity of the conversion: cosine of each converted model's last hidden states to MiniLM's
    (exact BERT) on the first 512 tokens of held-out text, fed alone (512 tokens) and as the start of a
    ``long_length`` input; mean and minimum over tokens of ``windows`` held-out pieces."""
    import torch

    from nystrom.model import NystromformerForMaskedLM, from_bert, minilm_path
    from nystrom_lab.data.text import build_token_cache, load_tokenizer
    from nystrom_lab.data.text_corpus import resolve_corpus
    from nystrom_lab.data.text_mlm import document_stream
    from nystrom_lab.data.text_pretrain import split_documents

    tok = load_tokenizer(minilm_path() / "tokenizer.json")
    files = resolve_corpus(list(run.corpus), run.out / "cache")
    corpus = build_token_cache(files, tok, run.out / "cache" / "tokens", doc_mode="blank")
    dev = split_documents(corpus.num_documents, run.dev_fraction)["dev"]
    stream = torch.from_numpy(document_stream(corpus, dev, sep_id=tok.sep_id))
    n, c = run.long_length, run.long_length - 2
    pieces = [torch.cat([torch.tensor([tok.cls_id]), stream[i * c : (i + 1) * c], torch.tensor([tok.sep_id])])
              for i in range(windows)]  # fmt: skip
    long_ids = torch.stack([p for p in pieces if len(p) == n])  # (w, n)
    short_ids = long_ids[:, :512]
    ref = from_bert(minilm_path(), attention="softmax")
    out = {}
    with torch.inference_mode():
        want = ref(short_ids).last_hidden_state  # (w, 512, e)
        for variant, (attention, _) in VARIANTS.items():
            if attention is None or variant not in run.variants:
                continue
            model = NystromformerForMaskedLM.from_pretrained(run.model_dir(variant)).eval()
            res = {}
            for name, ids in (("alone_512", short_ids), (f"start_of_{n}", long_ids)):
                got = model.nystromformer(ids).last_hidden_state[:, :512]
                cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)  # (w, 512)
                res[name] = {"mean": float(cos.mean()), "min": float(cos.min())}
            out[variant] = res
    return {"windows": int(long_ids.shape[0]), "tokens": 512, "cosine": out}


# ------------------------------------------------------------------------------------------ report
def plot(report: dict, png: Path) -> Path:
    """Dev MLM accuracy against step per variant, and the final accuracy per position bucket."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    variants = {k: v for k, v in report["variants"].items() if v}
    for name, v in variants.items():
        ax1.plot(v["curves"]["step"], [100 * a for a in v["curves"]["mlm_acc"]], "o-", ms=3, label=name)
    ax1.set(xlabel="step", ylabel="dev MLM accuracy (%)", title="continued MLM from MiniLM, Brown corpus")
    ax1.grid(alpha=0.3)
    ax1.legend()
    # by position: results.json is written with sorted keys, which would put "[1024, 2048)" before "[512, 1024)"
    buckets = sorted(next(iter(variants.values()))["mlm_acc_by_bucket"], key=lambda b: int(re.search(r"\d+", b)[0])) if variants else []
    width = 0.8 / max(1, len(variants))
    for i, (name, v) in enumerate(variants.items()):
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(buckets))]
        ax2.bar(xs, [100 * v["mlm_acc_by_bucket"].get(b, 0.0) for b in buckets], width, label=name)
    ax2.set_xticks(range(len(buckets)), buckets)
    ax2.set(
        xlabel="position in the 4096-token layout",
        ylabel="dev MLM accuracy (%)",
        title="at the last step, by position",
    )
    ax2.grid(axis="y", alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def table(report: dict) -> str:
    """Markdown table of the variants' accuracies (overall, per bucket), step time and memory."""
    variants = {k: v for k, v in report["variants"].items() if v}
    if not variants:
        return "no variant has been evaluated yet\n"
    # by position: results.json is written with sorted keys, which would put "[1024, 2048)" before "[512, 1024)"
    buckets = sorted(next(iter(variants.values()))["mlm_acc_by_bucket"], key=lambda b: int(re.search(r"\d+", b)[0]))
    head = [
        "variant",
        "steps",
        "step 0",
        "final",
        *buckets,
        "dev loss",
        "s/step (log)",
        "s/step (probe)",
        "peak MB",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, v in variants.items():
        pr = v.get("probe") or {}
        cells = [name, f"{v['steps']}/{v['target_steps']}", f"{100 * v['initial_mlm_acc']:.2f}",
                 f"{100 * v['final_mlm_acc']:.2f}", *(f"{100 * v['mlm_acc_by_bucket'][b]:.2f}" for b in buckets),
                 f"{v['final_mlm_loss']:.3f}", f"{v['median_step_s']:.1f}" if v.get("median_step_s") else "-",
                 f"{pr['median_step_s']:.1f}" if pr else "-", f"{pr['peak_mem_mb']:.0f}" if pr else "-"]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
        lean = v.get("probe_recompute")
        if lean:
            blank = [""] * (len(head) - 4)
            rows.append("| " + " | ".join([f"{name}, recompute=True", *blank, "-", f"{lean['median_step_s']:.1f}",
                                           f"{lean['peak_mem_mb']:.0f}"]) + " |")  # fmt: skip
    return "\n".join(rows) + "\n"


def write_report(run: LongContextRun, *, probes: bool = True, with_fidelity: bool = True) -> dict:
    """Collect every variant into ``OUT/results.json``, ``OUT/curves.png`` and ``OUT/results.md``; probes
    and fidelity already in an earlier results.json are kept unless recomputed."""
    path = run.out / "results.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    report = {"settings": run.record(), "variants": {}, "fidelity": old.get("fidelity")}
    for variant in run.variants:
        v = summarise(run, variant)
        if v:
            kept = (old.get("variants", {}).get(variant) or {}).get("probe")
            v["probe"] = probe_in_child(run, variant) if probes else kept
            if VARIANTS[variant][0] is not None and VARIANTS[variant][0]["name"] == "nystrom":
                kept = (old.get("variants", {}).get(variant) or {}).get("probe_recompute")
                v["probe_recompute"] = probe_in_child(run, variant, recompute=True) if probes else kept
            v["peak_mem_mb"] = v["probe"]["peak_mem_mb"] if v["probe"] else None
        report["variants"][variant] = v
    if with_fidelity:
        report["fidelity"] = fidelity(run)
    report["machine"] = machine()
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    plot(report, run.out / "curves.png")
    (run.out / "results.md").write_text(table(report))
    return report


def machine() -> dict:
    """The machine and versions a long-context report records."""
    env = environment("transformers")
    return {k: env[k] for k in ("cpu", "threads", "torch", "transformers", "python")}
