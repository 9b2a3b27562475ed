"""``python -m nystrom_lab.long_context.embeddings_contrastive``: a short contrastive continuation of the long
embedder on unlabelled documents (two spans of one document are positives, the batch's others negatives).

Legend: B documents per batch, La/Lb tokens of the two spans, e width.

Why: converted to 4096 positions and not trained, the long all-MiniLM-L6-v2 embeds whole documents but loses
half-document retrieval to 256-token chunk averaging (``embeddings.md``). The cheapest fix the literature
supports is unsupervised contrastive training on crops of one document (Contriever, Izacard et al. 2021:
independent random crops as positives, in-batch negatives; the same InfoNCE loss as sentence-transformers'
``MultipleNegativesRankingLoss``, temperature 0.05, here symmetric).

Data: Brown's documents with an even index train (``embeddings.split_documents``), the odd ones are never seen, and
``python -m nystrom_lab.long_context.embeddings --split held-out`` scores every embedder on them. A training
example is one document: each step crops two non-overlapping spans of ``--min-span``..``--max-span`` tokens
(lengths and places drawn from torch's generator, which the loop checkpoints, so a resumed run crops alike).
The dev set is 10 % of the training documents, each as its two halves cut to ``--max-span``; its metric is
the InfoNCE loss (the in-batch retrieval accuracy, logged too, moves in steps of one document in eight). The model is the sentence-transformers folder's encoder (mean pooling, as its
``1_Pooling`` says), trained by the one loop (:func:`nystrom_lab.training.loop.train`: checkpoints, resume,
best dev step); the best weights are written back as a sentence-transformers folder, OUT/model.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nystrom_lab.argtypes import ArgumentParser, existing_dir, positive_int
from nystrom_lab.long_context.embeddings import DEFAULT_LONG_MODEL, read_corpus
from nystrom_lab.training.config import TrainConfig
from nystrom_lab.training.task import Task

#: InfoNCE temperature (sentence-transformers' MultipleNegativesRankingLoss: scale 20)
TEMPERATURE = 0.05
#: share of the training documents kept as the dev set (at least 2)
DEV_SHARE = 0.1


def crop_pair(n: int, *, min_span: int, max_span: int, generator: torch.Generator | None = None) -> tuple[slice, slice]:
    """Two non-overlapping spans of a document of ``n`` tokens, each of min_span..max_span tokens (at most n // 2),
    in random order and places."""
    if n < 2:
        raise ValueError(f"a document of {n} token(s) has no two spans")
    hi = max(1, min(max_span, n // 2))
    lo = min(min_span, hi)
    la, lb = (int(torch.randint(lo, hi + 1, (), generator=generator)) for _ in range(2))
    gap = n - la - lb  # ≥ 0: free tokens to place before, between and after
    cuts = sorted(int(torch.randint(0, gap + 1, (), generator=generator)) for _ in range(2))
    a = slice(cuts[0], cuts[0] + la)
    b = slice(a.stop + cuts[1] - cuts[0], a.stop + cuts[1] - cuts[0] + lb)
    return (a, b) if bool(torch.randint(0, 2, (), generator=generator)) else (b, a)


def collate_pairs(items: list[tuple[str, list[int]]], *, cls: int, sep: int, pad: int, min_span: int,
                  max_span: int) -> dict[str, torch.Tensor]:  # fmt: skip
    """Items ``(mode, token ids)`` -> the two spans of each document as padded rows with [CLS] … [SEP]:
    ``crop`` draws two spans (:func:`crop_pair`), ``halves`` takes the two halves cut to ``max_span``."""
    spans = []
    for mode, ids in items:
        if mode == "crop":
            a, b = crop_pair(len(ids), min_span=min_span, max_span=max_span)
        else:
            half = len(ids) // 2
            a, b = slice(0, min(half, max_span)), slice(half, half + min(len(ids) - half, max_span))
        spans.append((ids[a], ids[b]))
    out = {}
    for side, k in (("a", 0), ("b", 1)):
        rows = [[cls, *s[k], sep] for s in spans]
        width = max(map(len, rows))
        out[f"{side}_ids"] = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (B, L)
        out[f"{side}_mask"] = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # (B, L)
    return out


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L, e) hidden states, (B, L) mask -> (B, e): the mean over real tokens (sentence-transformers')."""
    m = mask.to(hidden.dtype)[..., None]  # (B, L, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def contrastive_step(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, int]]]:
    """Symmetric InfoNCE over the batch (span a finds its span b among all b, and back); the accuracy is
    in-batch retrieval top-1 of a -> b."""
    ea = mean_pool(model(input_ids=batch["a_ids"], attention_mask=batch["a_mask"]).last_hidden_state, batch["a_mask"])
    eb = mean_pool(model(input_ids=batch["b_ids"], attention_mask=batch["b_mask"]).last_hidden_state, batch["b_mask"])
    logits = F.normalize(ea.float(), dim=-1) @ F.normalize(eb.float(), dim=-1).T / TEMPERATURE  # (B, B)
    target = torch.arange(logits.shape[0], device=logits.device)
    loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    return loss, {"accuracy": ((logits.argmax(-1) == target).sum(), int(target.shape[0]))}


def make_task(source: Path, documents: list[str], *, min_span: int, max_span: int) -> Task:
    """The loop's :class:`Task`: the encoder of the sentence-transformers folder ``source``, ``documents``
    (training texts) as crops, 10 % of them as the dev set's halves."""
    from transformers import AutoModel, AutoTokenizer

    import nystrom  # noqa: F401  (registers our model with transformers' Auto classes)

    tok = AutoTokenizer.from_pretrained(str(source))
    ids = tok(documents, add_special_tokens=False, verbose=False)["input_ids"]
    dev_count = max(2, round(DEV_SHARE * len(ids)))
    if len(ids) - dev_count < 2:
        raise ValueError(f"{len(ids)} training documents: too few for a batch and a dev set")
    model = AutoModel.from_pretrained(str(source))
    if getattr(model.config, "max_position_embeddings", max_span + 2) < max_span + 2:
        raise ValueError(f"--max-span {max_span} exceeds the model's {model.config.max_position_embeddings} positions")

    def collate(items):
        return collate_pairs(items, cls=tok.cls_token_id, sep=tok.sep_token_id, pad=tok.pad_token_id,
                             min_span=min_span, max_span=max_span)  # fmt: skip

    return Task(
        model=model, train=[("crop", x) for x in ids[dev_count:]], dev=[("halves", x) for x in ids[:dev_count]],
        collate=collate, step=contrastive_step, name="contrastive",
    )  # fmt: skip


def write_model(task: Task, source: Path, out: Path) -> Path:
    """The trained encoder as a sentence-transformers folder OUT/model (the source's pooling, tokenizer)."""
    folder = out / "model"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(source, folder)
    task.model.save_pretrained(str(folder))  # replaces config.json and the weights
    return folder


def main(argv: list[str] | None = None) -> int:
    from nystrom_lab.training.loop import train

    p = ArgumentParser(prog="python -m nystrom_lab.long_context.embeddings_contrastive",
                       description=(__doc__ or "").split("\n\n")[0])  # fmt: skip
    p.add_argument("--brown", type=existing_dir, default=Path("data/brown"), help="folder of `nystrom data brown`")
    p.add_argument("--long-model", type=existing_dir, default=DEFAULT_LONG_MODEL,
                   help=f"the sentence-transformers folder to continue (default {DEFAULT_LONG_MODEL})")  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="run folder (resumed when it holds a checkpoint)")
    p.add_argument("--seed", type=int, default=0, help="seed of the crops, the order and dropout (default 0)")
    p.add_argument("--steps", type=positive_int, default=60, help="optimiser steps (default 60)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="documents per step (default 8)")
    p.add_argument("--lr", type=float, default=2e-5, help="peak learning rate (default 2e-5)")
    p.add_argument("--min-span", type=positive_int, default=256, help="shortest span in tokens (default 256)")
    p.add_argument("--max-span", type=positive_int, default=1024, help="longest span in tokens (default 1024)")
    p.add_argument("--precision", default="bf16", help="fp32, bf16 or fp16 (default bf16)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, ... (default auto)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    if a.min_span > a.max_span:
        p.error(f"--min-span {a.min_span} exceeds --max-span {a.max_span}")
    corpus = read_corpus(a.brown, documents=None, split="train")
    task = make_task(a.long_model, corpus.whole, min_span=a.min_span, max_span=a.max_span)
    cfg = TrainConfig(
        steps=a.steps, batch_size=a.batch_size, lr=a.lr, warmup=max(1, a.steps // 10), weight_decay=0.01,
        precision=a.precision, device=a.device, eval_every=max(1, a.steps // 4), eval_at_start=True,
        seed=a.seed, metric="loss", metric_mode="min",  # the in-batch accuracy of 8 documents is coarse
    )  # fmt: skip
    results = train(task, cfg, a.out, progress=not a.no_progress)
    folder = write_model(task, a.long_model, a.out)
    print(f"[contrastive] best dev loss {results['best_dev']:.4f} at step {results['best_step']} of the trained steps;"
          f" wrote {folder}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
