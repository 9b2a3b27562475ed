"""``nystrom pretrain``: masked-LM + sentence-order-prediction pre-training (the paper's first stage).

Legend: b batch, L sequence length, e hidden size, v vocabulary, k masked positions of a batch.

Optimiser (paper): Adam lr 1e-4, β (0.9, 0.999), weight decay 0.01 (decoupled, as BERT's AdamW), 10k
warm-up steps of 500k then linear decay; presets scale the warm-up to 2% of the steps. Loss = MLM + SOP;
the MLM loss is the mean over examples of each example's mean over its masked tokens, so every DDP
rank's share of a batch weighs the same and 2 processes reproduce 1 process exactly. The MLM head
only runs on masked positions (k ≈ 0.15·b·L rows instead of b·L: the vocabulary projection is most of
a small model's cost).

Rows (``--packing``, :mod:`nystrom_lab.text.layout`): by default the training pairs are packed into
L-token rows, each attending only to itself (:mod:`nystrom_lab.data.packing`), and SOP is scored per
pair from its own ``[CLS]``; the dev pairs stay one per row, so dev metrics do not depend on the layout.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nystrom.model import NystromformerForPreTraining
from nystrom_lab.data.packed_batches import PackedRows, collate_packed
from nystrom_lab.data.records import describe_file, options_record
from nystrom_lab.data.text import TextTokenizer, build_token_cache, load_tokenizer, train_wordpiece
from nystrom_lab.data.text_corpus import resolve_corpus
from nystrom_lab.data.text_pretrain import PretrainingDataset, collate_pretraining
from nystrom_lab.text.layout import UNPACKED, choose_layout
from nystrom_lab.text.mlm import masked_token_loss
from nystrom_lab.text.models import load_start, save_model_folder, transfer
from nystrom_lab.text.pretrain_run import PretrainRun
from nystrom_lab.training import Task, TrainConfig, train


class PreTrainingObjective(nn.Module):
    """MLM + SOP of a :class:`NystromformerForPreTraining`, the MLM head run on masked positions only.

    Returns ``(loss, mlm_loss, sop_loss, mlm_correct, masked, sop_correct)`` (all scalar tensors). A packed
    batch (``packing``: :data:`~nystrom_lab.data.packed_batches.PACKING_KEYS`) goes to the model as it is;
    its ``sentence_order_label`` holds one label per pair (D,), each scored from the pair's first token.
    """

    def __init__(self, model: NystromformerForPreTraining) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids, labels, sentence_order_label, **packing):
        base = self.model.nystromformer
        masks = {"attention_mask": attention_mask, "token_type_ids": token_type_ids}
        out = base(input_ids=input_ids, **masks, **packing)  # hidden (b, L, e), pooled (b, e)
        sel = labels != -100  # (b, L)
        mlm, _, predicted, target = masked_token_loss(self.model.lm_head, out.last_hidden_state, labels)
        pooled = out.pooler_output  # (b, e)
        if "cu_seq_lens_q" in packing:
            pooled = document_pooled(base, out.last_hidden_state, packing["cu_seq_lens_q"])  # (D, e)
        sop_logits = self.model.sop_head(pooled)  # (b or D, 2)
        sop = F.cross_entropy(sop_logits.float(), sentence_order_label)
        mlm_correct = (predicted == target).sum()
        sop_correct = (sop_logits.argmax(-1) == sentence_order_label).sum()
        return mlm + sop, mlm.detach(), sop.detach(), mlm_correct, sel.sum(), sop_correct


def document_pooled(base: nn.Module, hidden: torch.Tensor, cu_seq_lens: torch.Tensor) -> torch.Tensor:
    """The pooler output of every packed document: the model's pooler (tanh of a dense layer) on each
    document's first token. ``hidden`` (b, n, e), ``cu_seq_lens`` (D + 1,) -> (D, e)."""
    if getattr(base, "pooler", None) is None:
        raise ValueError(
            "MLM + SOP on packed pairs needs the model's pooler (config.pooler=True); train with --packing off"
        )
    first = hidden.reshape(-1, hidden.shape[-1])[cu_seq_lens[:-1].long()]  # (D, e)
    return torch.tanh(base.pooler(first))


def pretrain_step(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, int]]]:
    """Loss and ``mlm_accuracy`` (over masked tokens), ``sop_accuracy``, ``mlm_loss``, ``sop_loss``
    (device tensors: the loop reads them once per evaluation, never per step)."""
    loss, mlm, sop, mlm_correct, masked, sop_correct = model(**batch)
    b = int(batch["input_ids"].shape[0])  # rows
    d = int(batch["sentence_order_label"].shape[0])  # pairs: b, or more in packed rows
    return loss, {
        "mlm_accuracy": (mlm_correct, masked),
        "sop_accuracy": (sop_correct, d),
        "mlm_loss": (mlm * b, b),
        "sop_loss": (sop * d, d),
    }


def check_eval_batches(num_dev: int, cfg: TrainConfig) -> None:
    """The loop's DDP evaluation hangs when a process gets no dev batch: refuse that up front."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    batches = math.ceil(num_dev / (cfg.eval_batch_size or cfg.batch_size))
    batches = min(batches, cfg.eval_batches or batches)
    if batches < world:
        raise ValueError(
            f"{num_dev} dev examples make {batches} evaluation batch(es) for {world} processes; every process"
            " needs one: use a smaller --batch-size, more --eval-batches or a larger --dev-fraction"
        )


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def resolve_tokenizer(run: PretrainRun, corpus: list[Path], beside_source: Path | None) -> TextTokenizer:
    """--tokenizer, else a WordPiece trained on the corpus (--train-tokenizer V), else the source's."""
    if run.tokenizer is not None:
        return load_tokenizer(run.tokenizer)
    if run.train_tokenizer is not None:
        path = run.out / "cache" / f"wordpiece-{run.train_tokenizer}.json"
        return (
            load_tokenizer(path)
            if path.is_file()
            else train_wordpiece(corpus, path, vocab_size=run.train_tokenizer)
        )
    if beside_source is not None:
        return load_tokenizer(beside_source)
    raise ValueError(
        "no tokenizer: give --tokenizer PATH or --train-tokenizer VOCAB, or --init-from a folder that has one"
    )


def build_model(run: PretrainRun) -> tuple[NystromformerForPreTraining, Path | None, bool]:
    """The model (seeded by ``run.seed``), the tokenizer.json of its start point (if any), and whether it
    is drawn from a preset configuration (which then takes the tokenizer's vocabulary)."""
    torch.manual_seed(run.seed)
    start = load_start(run.init_from, attention=run.attention, max_length=run.length())
    if start.model is not None:
        cfg = start.config.replace(pooler=True, pooling="pooler")
    else:
        cfg = start.config.replace(
            max_position_embeddings=max(start.config.max_position_embeddings, run.length())
        )
    if run.dropout is not None:
        cfg = cfg.replace(dropout=run.dropout)
    if start.model is not None:
        return transfer(start.model, NystromformerForPreTraining, cfg), start.tokenizer, False
    return NystromformerForPreTraining(cfg), None, start.preset


def make_task(run: PretrainRun) -> tuple[Task, TextTokenizer]:
    """Model, MLM+SOP train/dev splits of the corpus, collate and step for the shared loop (training pairs
    packed into rows under ``--packing documents``)."""
    files = resolve_corpus(list(run.corpus), run.out / "cache")
    model, beside, preset = build_model(run)
    tok = resolve_tokenizer(run, files, beside)
    cfg = model.config
    if tok.vocab_size > cfg.vocab_size:
        if not preset:
            raise ValueError(
                f"tokenizer {tok.path} has {tok.vocab_size} ids but the model only {cfg.vocab_size}"
            )
        torch.manual_seed(run.seed)  # a fresh preset model takes the tokenizer's vocabulary
        model = NystromformerForPreTraining(cfg.replace(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id))
    if run.length() > model.config.max_position_embeddings:
        raise ValueError(
            f"--max-length {run.length()} exceeds the model's {model.config.max_position_embeddings} positions"
        )
    cache = build_token_cache(files, tok, run.out / "cache" / "tokens", doc_mode=run.doc_mode)
    kw = dict(
        seq_len=run.length(), dev_fraction=run.dev_fraction, short_seq_prob=run.short_seq_prob, seed=run.seed
    )
    layout = choose_layout(run.packing, run.objective, model, out=run.out)
    train_set = PretrainingDataset(cache, tok, split="train", dupe_factor=run.dupe_factor, **kw)
    dev_set = PretrainingDataset(cache, tok, split="dev", **kw)  # one pair per row under every layout
    length, pad = run.length(), tok.pad_id
    if layout == "documents":
        train_set = PackedRows(
            train_set, train_set.example_lengths, max_length=length, seed=run.seed, copies=run.dupe_factor
        )

    def collate(items: list[dict]) -> dict[str, torch.Tensor]:
        if "document_lengths" in items[0]:  # packed training rows
            return collate_packed(items, pad_id=pad, pad_to=length)
        return collate_pretraining(items, pad_id=pad, pad_to=length)

    name = f"pretrain-{run.attention or 'own'}"
    objective = PreTrainingObjective(model)
    return Task(objective, train_set, collate, pretrain_step, dev=dev_set, name=name, layout=layout), tok


#: options added later: a record without them (or, for lr_scale, with None) meant these
_LATER_OPTIONS = {"lr_scale": [], "dev_seed": None}
#: model-config fields added later with these defaults (a record written before them describes the same model)
_LATER_CONFIG = {"position_extension": None}


def _upgrade(record: dict) -> dict:
    """``record`` as today's code would write it for the same run."""
    out = {**_LATER_OPTIONS, **record}
    if out["lr_scale"] is None:
        out["lr_scale"] = []
    if out.get("packing") is None:  # written before --packing: the objective's unpacked layout
        out["packing"] = UNPACKED[out.get("objective") or "mlm+sop"]
    if isinstance(out.get("model_config"), dict):
        out["model_config"] = {**_LATER_CONFIG, **out["model_config"]}
    return out


def same_run(old: dict, new: dict) -> bool:
    """Whether two ``pretrain_run.json`` records describe the same run: every option equal, the tokenizer
    compared by content (records written before tokenizers were hashed hold its path instead: a path
    is not compared, the vocabulary is checked when the model and data load)."""
    keys = ("tokenizer", "tokenizer_file")
    old, new = _upgrade(old), _upgrade(new)
    strip = lambda r: {k: v for k, v in r.items() if k not in keys}  # noqa: E731
    old_tok, new_tok = old.get("tokenizer"), new.get("tokenizer")
    if (
        isinstance(old_tok, dict)
        and isinstance(new_tok, dict)
        and old_tok.get("sha256") != new_tok.get("sha256")
    ):
        return False
    return strip(old) == strip(new)


def run_pretrain(run: PretrainRun, *, progress: bool = True) -> dict:
    """Train; writes ``out/{pretrain_run.json, metrics.jsonl, results.json, curves.png}`` and the best
    (dev MLM accuracy) weights as a transformers folder ``out/model/`` (``NystromformerForPreTraining``, loads
    with ``AutoModelForPreTraining``/``AutoModelForMaskedLM``) with its tokenizer."""
    if run.objective == "mlm":
        from nystrom_lab.text.mlm import make_mlm_task

        task, tok = make_mlm_task(run)
    else:
        task, tok = make_task(run)
    run = dataclasses.replace(run, packing=task.layout)  # the layout chosen: recorded, kept on resumption
    if run.gradient_checkpointing:
        task.model.model.gradient_checkpointing_enable()
    record = options_record(run)
    record["corpus"] = list(run.corpus)
    record.pop("out")
    # the tokenizer by content and package, not by a machine path (the --tokenizer option's value included)
    record.update(model_config=task.model.model.config.definition(), tokenizer=describe_file(tok.path))
    record = json.loads(json.dumps(record))  # as the file holds it (tuples as lists), so that the two compare
    path = run.out / "pretrain_run.json"
    if path.exists() and not same_run(old := json.loads(path.read_text()), record):
        old, new = _upgrade(old), _upgrade(record)
        differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        raise ValueError(
            f"{run.out} holds a run with other options ({', '.join(differ)} differ); use another --out or the"
            " same options"
        )
    if _rank() == 0:
        run.out.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
        os.replace(tmp, path)
    cfg = run.train_config()
    check_eval_batches(len(task.dev), cfg)
    results = train(task, cfg, run.out, progress=progress)
    # train_examples: rows when packed
    results.update(train_examples=len(task.train), dev_examples=len(task.dev), layout=task.layout)
    if _rank() == 0:
        save_model_folder(task.model.model, tok.path, run.out / "model")
        (run.out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    return results
