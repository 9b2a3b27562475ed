"""Dev MLM accuracy of the ``long-positions`` variants by a token's offset *within its document*.

Legend: L a variant's row length, c = L - 2, D held-out documents, t tokens of the dev stream, B buckets.

The training logs key a dev token by its position in the row (a stream row of 4096 starts anywhere in a
document; a packed row starts one). Here every variant's trained model is scored again on the same held-out
documents and the same masked tokens, each token keyed by its offset from its document's first token
(0, 1, ...), in the buckets :data:`BUCKETS`. This holds in every layout because the dev masks are drawn once
over the dev split's stream (:class:`~nystrom_lab.data.text_mlm.PackedMLMDataset`) and every layout cuts
that one stream: a ``stream`` piece j holds stream tokens [j·c, (j+1)·c) (a 512-token window's offset is
the window's start + its position), a ``documents`` piece starts at its document's piece offset. A token at
stream index s of document d (starting at s_d) has offset s − s_d.

Each variant is scored in the layout it trained on and, with ``cross``, in the other one (``@stream`` /
``@documents``), at its own length, bf16 as the runs; one JSON per (variant, layout) in ``OUT/within/``,
recomputed when the variant's ``results.json`` is newer. Variants without weights are skipped (results are
committed, weights are not).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nystrom_lab.long_context.positions import PositionsRun, variant_layout
from nystrom_lab.long_context.positions_budget import real_tokens, split_lengths, token_cache
from nystrom_lab.long_context.positions_packed import BUCKETS, read_within

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from nystrom.model import NystromformerForMaskedLM
    from nystrom_lab.data.text import TextTokenizer, TokenizedCorpus
    from nystrom_lab.data.text_mlm import PackedMLMDataset

#: lower edges of the within-document buckets, and their labels
EDGES = (0, 512, 1024, 2048)
LAYOUTS = ("stream", "documents")


def document_starts(lengths: np.ndarray) -> np.ndarray:
    """Stream offsets of documents of ``lengths`` (D,), each followed by one ``[SEP]``: (D,)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]).astype(np.int64)


def within_offsets(index: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Offsets within their documents of stream indices ``index`` (t,), documents starting at ``starts`` (D,)."""
    index = np.asarray(index, dtype=np.int64)
    return index - starts[np.searchsorted(starts, index, side="right") - 1]


def bucket_of(offsets: np.ndarray) -> np.ndarray:
    """The bucket (index into :data:`BUCKETS`) of within-document ``offsets`` (t,)."""
    return np.searchsorted(np.asarray(EDGES[1:]), np.asarray(offsets), side="right")


class WithinDocument(Sequence):
    """Items of a dev set of :class:`~nystrom_lab.data.text_mlm.PackedMLMDataset` (``stream``) or
    :class:`~nystrom_lab.data.text_mlm_documents.DocumentMLMDataset` (``documents``), each item's
    ``positions`` (n,) replaced by its tokens' offsets within their documents (``[CLS]``/``[SEP]``: 0)."""

    def __init__(self, base: PackedMLMDataset, lengths: np.ndarray) -> None:
        self.base = base
        self.starts = document_starts(lengths)  # (D,)
        if int(self.starts[-1] + lengths[-1] + 1) != len(base.stream):
            raise ValueError("the document lengths do not describe the data set's stream")
        # (P,) stream offset of each piece's first content token
        self.piece_start = getattr(base, "piece_start", np.arange(base.pieces, dtype=np.int64) * base.content)

    @property
    def example_lengths(self) -> np.ndarray:
        return self.base.example_lengths

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        import torch

        item = dict(self.base[i])
        lo = int(self.piece_start[i % self.base.pieces])
        n = len(item["input_ids"]) - 2  # content tokens
        offsets = within_offsets(np.arange(lo, lo + n), self.starts)
        item["positions"] = torch.from_numpy(np.concatenate([[0], offsets, [0]]).astype(np.int64))
        return item


def dev_rows(
    corpus: TokenizedCorpus, tok: TextTokenizer, *, layout: str, length: int, dev_fraction: float, seed: int,
    reference_length: int,
) -> tuple[Sequence, Callable[[list[dict]], dict]]:  # fmt: skip
    """The dev set of ``layout`` at ``length`` (masks from ``seed``), keyed within documents, and its collate."""
    from nystrom_lab.data.packed_batches import PackedRows, collate_packed
    from nystrom_lab.data.text_mlm import PackedMLMDataset, collate_mlm
    from nystrom_lab.data.text_mlm_documents import DocumentMLMDataset

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    kw = dict(split="dev", seq_len=length, dev_fraction=dev_fraction, seed=seed, fixed_masks=True,
              reference_length=reference_length)  # fmt: skip
    lengths = split_lengths(corpus, "dev", dev_fraction)
    pad = tok.pad_id
    if layout == "stream":
        data = WithinDocument(PackedMLMDataset(corpus, tok, **kw), lengths)
        return data, lambda items: collate_mlm(items, pad_id=pad, pad_to=length)
    docs = WithinDocument(DocumentMLMDataset(corpus, tok, **kw), lengths)
    rows = PackedRows(docs, docs.example_lengths, max_length=length, seed=seed)
    return rows, lambda items: collate_packed(items, pad_id=pad, pad_to=length)


def score(
    model: NystromformerForMaskedLM, data: Sequence, collate: Callable[[list[dict]], dict], *, batch_size: int,
    precision: str, device: str = "auto", desc: str | None = None,
) -> dict:  # fmt: skip
    """Dev MLM accuracy and loss of ``model`` (a NystromformerForMaskedLM) over ``data`` (items keyed within
    documents), overall and per bucket, with the masked-token counts; ``desc`` shows a progress bar."""
    import torch

    from nystrom_lab.text.mlm import MaskedLMObjective
    from nystrom_lab.training.device import autocast, resolve_device, to_device

    dev = resolve_device(device)
    objective = MaskedLMObjective(model, edges=(*EDGES, 1 << 30)).to(dev).eval()
    sums = torch.zeros(3, len(BUCKETS), dtype=torch.float64)  # correct, masked, loss
    starts = range(0, len(data), batch_size)
    if desc is not None:
        from tqdm import tqdm

        starts = tqdm(starts, desc=desc, unit="batch", dynamic_ncols=True)
    with torch.no_grad(), autocast(dev, precision):
        for lo in starts:
            batch = to_device(collate([data[i] for i in range(lo, min(lo + batch_size, len(data)))]), dev)
            *_, correct, count, loss = objective(**batch)
            sums += torch.stack([correct, count, loss]).double().cpu()
    correct, count, loss = sums
    n = float(count.sum())
    return {
        "mlm_acc": float(correct.sum()) / max(n, 1), "mlm_loss": float(loss.sum()) / max(n, 1), "masked": int(n),
        "mlm_acc_by_bucket": {b: float(c / k) if k else None for b, c, k in zip(BUCKETS, correct, count)},
        "masked_by_bucket": {b: int(k) for b, k in zip(BUCKETS, count)},
    }  # fmt: skip


def score_variant(
    run: PositionsRun, variant: str, layout: str, *, device: str = "auto", progress: bool = True
) -> dict:
    """``variant``'s trained model (``OUT/variant/model``) scored in ``layout`` at its own length."""
    from nystrom.model import NystromformerForMaskedLM

    corpus, tok = token_cache(run)
    length = run.length(variant)
    data, collate = dev_rows(corpus, tok, layout=layout, length=length, dev_fraction=run.dev_fraction,
                             seed=run.seed, reference_length=run.long_length)  # fmt: skip
    model = NystromformerForMaskedLM.from_pretrained(run.out / variant / "model").eval()
    desc = f"within-document {variant}@{layout}" if progress else None
    out = score(model, data, collate, batch_size=run.tokens_per_step // length, precision=run.precision,
                device=device, desc=desc)  # fmt: skip
    results = json.loads((run.out / variant / "results.json").read_text())
    steps = results.get("step", run.variant_steps(variant))
    out.update(variant=variant, layout=layout, trained_layout=variant_layout(variant), length=length,
               steps=steps, weights_step=results.get("best_step"),
               real_tokens_seen=real_tokens(run, variant, [steps])[0])  # fmt: skip
    return out


def entry_path(run: PositionsRun, variant: str, layout: str) -> Path:
    """``OUT/within/{variant}@{layout}.json``."""
    return run.out / "within" / f"{variant}@{layout}.json"


def within_document(run: PositionsRun, variants: Sequence[str], *, cross: bool = True, device: str = "auto",
                    progress: bool = True) -> dict[str, dict]:  # fmt: skip
    """Score each of ``variants`` that has weights in its own layout (and the other with ``cross``), each once
    per training (a finished entry newer than the variant's results.json is read back); returns
    :func:`read_within`."""
    for variant in variants:
        folder = run.out / variant
        if not (folder / "results.json").is_file() or not (folder / "model" / "config.json").is_file():
            print(
                f"[{run.TAG}] within-document: {variant} skipped (no trained weights in {folder / 'model'})"
            )
            continue
        own = variant_layout(variant)
        for layout in (own, *(x for x in LAYOUTS if x != own and cross)):
            path = entry_path(run, variant, layout)
            if path.is_file() and path.stat().st_mtime_ns >= (folder / "results.json").stat().st_mtime_ns:
                continue
            entry = score_variant(run, variant, layout, device=device, progress=progress)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps(entry, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, path)
    return read_within(run)
