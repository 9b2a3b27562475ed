"""Figure 5: dev MLM (and SOP) accuracy vs step of several ``nystrom pretrain`` runs in one PNG and a
markdown table (:func:`plot_runs`, ``nystrom plot-runs``), and the from-scratch experiment that trains
every attention variant the same way and reports them together (:func:`run_figure5`,
``nystrom pretrain figure5``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nystrom_lab import attention_spec
from nystrom_lab.data.constants import DUPE_FACTOR
from nystrom_lab.data.records import METRICS_LOG, describe_file, median_step_s, options_record, read_metrics
from nystrom_lab.text.curves import (
    METRICS,
    curves_table,
    dev_curves,
    dev_summary,
    wall_time,
)
from nystrom_lab.text.presets import FIG5_VARIANTS

if TYPE_CHECKING:
    from nystrom_lab.text.pretrain_run import PretrainRun
# the training stack (torch, transformers) is imported where it is used: the CLI builds its parser from
# this module's defaults before anything heavy is loaded


def _label(run: Path) -> str:
    """The run's attention spec, with " no conv" for a Nyström run trained without its conv skip when the
    spec does not say so (runs recorded before conv_kernel_size was a key of the spec)."""
    info = run / "pretrain_run.json"
    if not info.is_file():
        return run.name
    record = json.loads(info.read_text())
    spec = record.get("attention") or run.name  # None: the start point's own attention
    attn = record.get("model_config", {}).get("attention", {})
    no_conv = attn.get("name") == "nystrom" and "conv_kernel_size" in attn and not attn["conv_kernel_size"]
    return spec + (" no conv" if no_conv and "conv_kernel_size" not in spec else "")


def plot_runs(
    runs: list[Path], png: Path, table: Path | None = None, *, title: str = "MLM / SOP validation accuracy"
) -> str:
    """Draw the runs' dev curves (one panel per metric) into ``png``; return (and write to ``table``) the
    markdown table ``step | <run> MLM | <run> SOP | ...``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {_label(Path(r)): dev_curves(Path(r)) for r in runs}
    if len(curves) != len(runs):
        raise ValueError(f"runs must have distinct attention labels, got {[_label(Path(r)) for r in runs]}")
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5.2 * len(METRICS), 3.8))
    for ax, metric in zip(axes, METRICS):
        for label, c in curves.items():
            if c[metric]:
                ax.plot(*zip(*c[metric]), "o-", ms=3, label=label)
        ax.set(xlabel="step", ylabel=f"dev {metric.replace('_', ' ')}", title=metric.split("_")[0].upper())
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    text = curves_table(curves)
    if table is not None:
        Path(table).write_text(text)
    return text


# ---------------------------------------------------------------- Figure 5 from scratch
FIG5_TITLE = "BERT-small from scratch: dev MLM / SOP accuracy (Fig. 5)"


@dataclass(frozen=True)
class Figure5Run:
    """Options of ``nystrom pretrain figure5``: every variant trained from a random initialisation with
    the same tokenizer, data, examples, masks, steps and optimiser; only the attention differs.

    Defaults: BERT-small's depth (4 layers) at the paper's length 512, width reduced to e = 256 (4 heads,
    FFN 1024); the paper's optimiser (AdamW β (0.9, 0.999), ε 1e-6, weight decay 0.01, clip 1.0) and
    schedule shape (linear warm-up, then linear decay); peak lr 5e-4 because the paper's 1e-4 belongs to
    batch 256 and 0.1M steps (the same lr for every variant). The warm-up defaults to 2% of the steps,
    BERT-base's 10k of 0.5M; BERT-small's 10k of 0.1M would be 10% (``warmup=steps // 10``).
    """

    corpus: tuple[str, ...]
    out: Path = Path("experiments/fig5-scratch")
    variants: tuple[str, ...] = FIG5_VARIANTS
    tokenizer: Path | None = None  # None: MiniLM's tokenizer.json (BERT uncased WordPiece, 30522 ids)
    hidden_size: int = 256
    num_heads: int = 4
    intermediate_size: int = 1024
    num_layers: int = 4
    max_length: int = 512
    batch_size: int = 16
    steps: int = 2000
    lr: float = 5e-4
    warmup: int | None = None  # None: 2% of the steps (BERT-base's 10k of 500k; BERT-small's is 10%)
    eval_every: int = 100
    eval_batches: int = 16
    dupe_factor: int = DUPE_FACTOR  # mask draws per training pair (see PretrainingDataset)
    dropout: float | None = None
    dev_fraction: float = 0.05
    seed: int = 0
    precision: str = "fp32"  # fp32, bf16, fp16 (nystrom_lab.training.device)
    device: str = "auto"
    compile: bool = False

    def __post_init__(self) -> None:
        if not self.variants or len(set(self.variants)) != len(self.variants):
            raise ValueError(f"--variants must be distinct and non-empty, got {list(self.variants)}")
        for v in self.variants:
            try:
                attention_spec.parse(v)  # fail before any training
            except ValueError as err:
                raise ValueError(f"--variants: {err}") from err
        if self.hidden_size % self.num_heads:
            raise ValueError(f"--hidden {self.hidden_size} must be divisible by --heads {self.num_heads}")

    def tokenizer_path(self) -> Path:
        from nystrom.model import minilm_path

        return Path(self.tokenizer) if self.tokenizer is not None else minilm_path() / "tokenizer.json"

    def labels(self) -> tuple[str, ...]:
        """The variants' canonical specs (main option resolved: ``nystrom`` -> ``nystrom-64``), which name
        their run folders and records: ``nystrom`` and ``nystrom-64`` are one run."""
        labels = tuple(attention_spec.label(v) for v in self.variants)
        if len(set(labels)) != len(labels):
            raise ValueError(f"--variants must be distinct, got {list(self.variants)} (= {list(labels)})")
        return labels

    def variant_run(self, label: str) -> PretrainRun:
        """The ``nystrom pretrain`` run of one variant (by its label), in ``out/<label>``."""
        from nystrom_lab.text.pretrain_run import PretrainRun

        return PretrainRun(
            corpus=tuple(self.corpus), out=self.out / label, preset="paper", tokenizer=self.tokenizer_path(),
            init_from=str(self.out / "model.json"), attention=label,
            steps=self.steps, batch_size=self.batch_size, max_length=self.max_length, lr=self.lr, warmup=self.warmup,
            eval_every=self.eval_every, eval_batches=self.eval_batches, dropout=self.dropout,
            dev_fraction=self.dev_fraction, seed=self.seed, dupe_factor=self.dupe_factor, precision=self.precision,
            device=self.device, compile=self.compile,
            packing="off",  # one pair per row for every variant: linformer, performer, ... cannot pack
        )  # fmt: skip

    def write_model_config(self) -> Path:
        """``out/model.json``: bert-small at the chosen width and the tokenizer's vocabulary; refuses to
        overwrite a different one (the variants already trained would no longer be comparable)."""
        from nystrom.model import NystromformerConfig
        from nystrom_lab.data.text import load_tokenizer
        from nystrom_lab.text.models import load_config

        tok = load_tokenizer(self.tokenizer_path())
        cfg = NystromformerConfig.preset(
            "bert-small", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, hidden_size=self.hidden_size,
            num_attention_heads=self.num_heads, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, classifier_hidden=self.hidden_size,
            max_position_embeddings=max(512, self.max_length),
        )  # fmt: skip
        path = self.out / "model.json"
        if path.is_file():
            if load_config(str(path)).definition() != cfg.definition():
                raise ValueError(f"{path} holds another model; use another --out or the same width options")
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            cfg.to_json_file(path)
        return path


def _finished(run: PretrainRun) -> bool:
    res = run.out / "results.json"
    return res.is_file() and json.loads(res.read_text()).get("step") == run.train_config().steps


def summarize(run: PretrainRun) -> dict:
    """What ``results.json`` reports of one variant (from its metrics.jsonl; partial runs included)."""
    cfg = run.train_config()
    out: dict = {"attention": run.attention, "run_dir": str(run.out), "target_steps": cfg.steps}
    recs = read_metrics(run.out / METRICS_LOG, missing_ok=True)
    train_recs = [r for r in recs if r["split"] == "train"]
    dev = [r for r in recs if r["split"] == "dev"]
    steps = max((r["step"] for r in train_recs), default=0)
    out.update(steps=steps, finished=_finished(run), tokens_seen=steps * cfg.batch_size * run.length())
    out["wall_time_s"] = round(wall_time(train_recs), 3)
    step_s = median_step_s(train_recs)
    out["median_step_s"] = None if step_s is None else round(step_s, 3)
    out.update(dev_summary(dev))
    return out


def write_report(cr: Figure5Run) -> dict:
    """``out/results.json`` (settings + one summary per variant), ``out/curves.png`` and
    ``out/curves.md`` (dev MLM/SOP accuracy per step, one line per variant with a dev evaluation)."""
    variants = {v: summarize(cr.variant_run(v)) for v in cr.labels()}
    settings = {k: v for k, v in options_record(cr).items() if k not in ("out", "variants")}
    settings.update(corpus=list(cr.corpus), tokenizer=describe_file(cr.tokenizer_path()))
    report = {"experiment": "fig5-scratch", "settings": settings, "variants": variants}
    cr.out.mkdir(parents=True, exist_ok=True)
    tmp = cr.out / f"results.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(report, indent=2) + "\n")  # variants in the order run
    os.replace(tmp, cr.out / "results.json")
    drawn = [cr.out / v for v, s in variants.items() if "final_mlm_accuracy" in s]
    if drawn:
        plot_runs(drawn, cr.out / "curves.png", cr.out / "curves.md", title=FIG5_TITLE)
    return report


def run_figure5(cr: Figure5Run, *, progress: bool = True, report_only: bool = False) -> dict:
    """Run (or resume) every variant in turn, skipping finished ones, then :func:`write_report`.
    A variant interrupted part-way resumes from ``out/<variant>/last`` on the next call."""
    from nystrom_lab.text.pretrain import run_pretrain

    if not report_only:
        cr.write_model_config()
        for variant in cr.labels():
            run = cr.variant_run(variant)
            if _finished(run):
                print(f"[nystrom] {variant}: finished, skipped")
                continue
            run_pretrain(run, progress=progress)
            write_report(cr)  # after each variant, so a long experiment shows its progress
    return write_report(cr)
