"""``nystrom pretrain --objective mlm``: masked-LM-only (continued) pre-training on packed whole documents.

Legend: b batch, L sequence length, e hidden size, v vocabulary, k masked positions of a batch, B position
buckets.

The long-context recipe's second half (the first is ``nystrom convert long``): ``--init-from`` a folder of
ours (e.g. a converted long model; any start point works), whole documents in L-token rows, masks redrawn
per copy, the MLM head run on masked positions only, and the dev set scored on fixed masks, overall and
per position bucket ([0, 512), [512, 1024), [1024, 2048), ... of the reference length R), so runs of
different lengths, attentions and layouts are scored on the same tokens with the same masks.

Rows (``--packing``, :mod:`nystrom_lab.text.layout`), for the training and the dev documents alike:
``documents`` (the default where the model packs) packs documents, a longer one cut into L-token pieces
of their own (:class:`~nystrom_lab.data.text_mlm_documents.DocumentMLMDataset` in
:class:`~nystrom_lab.data.packed_batches.PackedRows`), each attending only to itself; ``stream`` cuts the
documents' concatenation into rows, a row's documents seeing each other
(:class:`~nystrom_lab.data.text_mlm.PackedMLMDataset`); ``off`` pads one document piece per row.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from nystrom.convert.transfer import transfer
from nystrom.layers.cross_entropy import linear_cross_entropy
from nystrom.model import NystromformerForMaskedLM
from nystrom_lab.data.packed_batches import PackedRows, collate_packed
from nystrom_lab.data.text import TextTokenizer, build_token_cache, load_tokenizer
from nystrom_lab.data.text_corpus import resolve_corpus
from nystrom_lab.data.text_mlm import PackedMLMDataset, collate_mlm, position_buckets
from nystrom_lab.data.text_mlm_documents import DocumentMLMDataset
from nystrom_lab.text.layout import choose_layout
from nystrom_lab.text.models import load_start
from nystrom_lab.training import Task

if TYPE_CHECKING:
    from nystrom_lab.text.pretrain_run import PretrainRun


def bucket_metric(name: str, lo: int, hi: int) -> str:
    """``mlm_accuracy@512-1024``: the metric ``name`` over tokens at reference positions [lo, hi)."""
    return f"{name}@{lo}-{hi}"


def masked_token_loss(lm_head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor):
    """The MLM loss with the head run on the masked positions only (k ≈ 0.15·b·L rows instead of b·L: the
    vocabulary projection is most of a small model's cost), its decoder and cross-entropy fused block by
    block (:func:`~nystrom.layers.cross_entropy.linear_cross_entropy`: no (k, v) logits are held).

    ``hidden`` (b, L, e), ``labels`` (b, L) with -100 at unpredicted positions -> ``(loss, token losses
    (k,), predicted ids (k,), targets (k,))``; ``loss`` is the mean over the b examples of each example's
    mean token loss (an example without masked tokens adds 0), the other three are detached."""
    sel = labels != -100  # (b, L)
    target = labels[sel]  # (k,)
    per_example = sel.sum(1, keepdim=True).clamp_min(1)  # (b, 1) masked tokens of each example
    row_weight = (1.0 / (per_example * len(labels)).float()).expand_as(labels)[sel]  # (k,)
    x = lm_head.transform(hidden[sel])  # (k, e)
    loss, token_loss, predicted = linear_cross_entropy(
        x, lm_head.decoder.weight, lm_head.decoder.bias, target, row_weight
    )
    return loss, token_loss, predicted, target


class MaskedLMObjective(nn.Module):
    """MLM loss of a :class:`NystromformerForMaskedLM`, its head run on masked positions only.

    ``forward(input_ids, attention_mask, labels, positions, **packing)`` (each (b, L); ``packing``: a packed
    batch's :data:`~nystrom_lab.data.packed_batches.PACKING_KEYS`, passed to the model as they are) returns
    ``(loss, loss_sum, correct, masked, bucket_correct, bucket_count, bucket_loss)``: the loss to train
    (mean over rows of each row's mean over its masked tokens), the summed token loss, correct and masked
    token counts (scalars), and per-bucket sums (B,) keyed by ``positions``.
    """

    def __init__(self, model: NystromformerForMaskedLM, *, edges: tuple[int, ...]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("inner_edges", torch.tensor(edges[1:-1], dtype=torch.long), persistent=False)
        self.num_buckets = len(edges) - 1

    def forward(self, input_ids, attention_mask, labels, positions, **packing):
        model = self.model.nystromformer
        out = model(input_ids=input_ids, attention_mask=attention_mask, **packing)  # hidden (b, L, e)
        sel = labels != -100  # (b, L)
        loss, token_loss, predicted, target = masked_token_loss(
            self.model.lm_head, out.last_hidden_state, labels
        )
        correct = (predicted == target).float()  # (k,)
        bucket = torch.bucketize(positions[sel], self.inner_edges, right=True)  # (k,) in [0, B)
        zeros = torch.zeros(self.num_buckets, device=labels.device)
        return (
            loss, token_loss.sum(), correct.sum(), sel.sum(),
            zeros.index_add(0, bucket, correct), zeros.index_add(0, bucket, torch.ones_like(correct)),
            zeros.index_add(0, bucket, token_loss),
        )  # fmt: skip


def make_mlm_step(edges: tuple[int, ...]):
    """The loop's step function: loss and ``mlm_accuracy``/``mlm_loss`` over masked tokens, overall and per
    bucket (device tensors; the loop reads them once per evaluation)."""
    spans = list(zip(edges[:-1], edges[1:]))

    def step(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        loss, loss_sum, correct, masked, b_correct, b_count, b_loss = model(**batch)
        metrics = {"mlm_accuracy": (correct, masked), "mlm_loss": (loss_sum, masked)}
        for i, (lo, hi) in enumerate(spans):
            metrics[bucket_metric("mlm_accuracy", lo, hi)] = (b_correct[i], b_count[i])
            metrics[bucket_metric("mlm_loss", lo, hi)] = (b_loss[i], b_count[i])
        return loss, metrics

    return step


def mlm_model(run: PretrainRun) -> tuple[NystromformerForMaskedLM, Path | None]:
    """The masked-LM to train and the tokenizer.json beside its source (None: the source has none)."""
    torch.manual_seed(run.seed)
    start = load_start(run.init_from, attention=run.attention, max_length=run.length())
    model = start.model if start.model is not None else NystromformerForMaskedLM(start.config)
    config = model.config if run.dropout is None else model.config.replace(dropout=run.dropout)
    if type(model) is not NystromformerForMaskedLM or config is not model.config:
        model = transfer(model, NystromformerForMaskedLM, config)
    return model, start.tokenizer


def make_mlm_task(run: PretrainRun) -> tuple[Task, TextTokenizer]:
    """Model, train/dev splits in the run's layout (``--packing``), collate and step of an MLM-only run."""
    files = resolve_corpus(list(run.corpus), run.out / "cache")
    model, beside = mlm_model(run)
    if run.tokenizer is None and beside is None:
        raise ValueError(
            "no tokenizer: the --init-from start point has no tokenizer.json; give --tokenizer PATH"
        )
    tok = load_tokenizer(run.tokenizer or beside)
    if tok.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"tokenizer {tok.path} has {tok.vocab_size} ids but the model only {model.config.vocab_size}"
        )
    length = run.length()
    if length > model.config.max_position_embeddings:
        raise ValueError(
            f"--max-length {length} exceeds the model's {model.config.max_position_embeddings} positions;"
            f" extend it first: nystrom convert long --init-from SRC --max-length {length} --out DIR"
        )
    if run.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    layout = choose_layout(run.packing, "mlm", model, out=run.out)
    cache = build_token_cache(files, tok, run.out / "cache" / "tokens", doc_mode=run.doc_mode)
    kw = dict(seq_len=length, dev_fraction=run.dev_fraction, seed=run.seed)
    ref = run.reference_length or length
    dev_seed = run.seed if run.dev_seed is None else run.dev_seed  # the same dev tokens across seeds
    dev_kw = {**kw, "seed": dev_seed, "fixed_masks": True, "reference_length": ref}
    data = PackedMLMDataset if layout == "stream" else DocumentMLMDataset
    train_set = data(cache, tok, split="train", dupe_factor=run.dupe_factor, **kw)
    dev_set = data(cache, tok, split="dev", **dev_kw)
    if layout == "documents":
        train_set = PackedRows(
            train_set, train_set.example_lengths, max_length=length, seed=run.seed, copies=run.dupe_factor
        )
        dev_set = PackedRows(dev_set, dev_set.example_lengths, max_length=length, seed=dev_seed)
    edges = position_buckets(ref)
    pad = tok.pad_id

    def collate(items: list[dict]) -> dict[str, torch.Tensor]:
        if "document_lengths" in items[0]:  # packed rows
            return collate_packed(items, pad_id=pad, pad_to=length)
        return collate_mlm(items, pad_id=pad, pad_to=length)

    task = Task(
        MaskedLMObjective(model, edges=edges), train_set, collate, make_mlm_step(edges), dev=dev_set,
        name=f"mlm-{length}", layout=layout,
    )  # fmt: skip
    return task, tok
