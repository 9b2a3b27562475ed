"""MLM + sentence-order-prediction examples from a :class:`~nystrom_lab.data.text.TokenizedCorpus`.

Legend: n tokens of one example (<= L, the sequence length), k masked positions, b batch, v vocabulary.

Instances (BERT's ``create_instances_from_document`` with ALBERT's SOP): walking each document, segments
are packed into a chunk until it reaches a target of L - 3 tokens (with probability ``short_seq_prob`` =
0.1 a shorter target drawn uniformly from [2, L - 3], drawn per chunk); the chunk is split into A and B at
a random segment boundary (or at a random token when it holds one segment; segments longer than L - 3
are first cut into pieces of L - 3). Items are made on the fly from ``(seed, split, index)`` alone:
the pair is truncated to L - 3 (trimming the longer side at a random end, as BERT), swapped with
probability 0.5 (SOP label 1 = swapped), laid out as ``[CLS] A [SEP] B [SEP]`` and masked — so a
resumed or multi-process run sees identical examples and masks. An example's length does not depend on
the draw (:attr:`PretrainingDataset.example_lengths`), so pairs can be packed into rows ahead of time
(:class:`~nystrom_lab.data.packed_batches.PackedRows`, ``nystrom pretrain --packing documents``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from nystrom_lab.data.constants import MASK_PROB, SHORT_SEQ_PROB, SPLIT_SALT
from nystrom_lab.data.text import TextTokenizer, TokenizedCorpus


def split_documents(num_documents: int, dev_fraction: float) -> dict[str, np.ndarray]:
    """Document ids of the train and held-out (dev) splits: ``round(D·fraction)`` (at least one) evenly
    spaced documents go to dev, so both splits sample the whole corpus."""
    if not 0.0 < dev_fraction < 1.0:
        raise ValueError(f"dev_fraction must be in (0, 1), got {dev_fraction!r}")
    if num_documents < 2:
        raise ValueError(f"the corpus needs at least 2 documents to hold one out, got {num_documents}")
    n_dev = min(num_documents - 1, max(1, round(num_documents * dev_fraction)))
    dev = np.unique(np.linspace(0, num_documents - 1, n_dev).round().astype(np.int64))
    train = np.setdiff1d(np.arange(num_documents, dtype=np.int64), dev)
    return {"train": train, "dev": dev}


def build_instances(
    corpus: TokenizedCorpus,
    doc_ids: np.ndarray,
    *,
    seq_len: int,
    short_seq_prob: float = SHORT_SEQ_PROB,
    seed: int = 0,
) -> np.ndarray:
    """Instances of the documents ``doc_ids`` as token offsets ``(start, split, end)``: (I, 3) int64.

    A = tokens[start:split], B = tokens[split:end] (consecutive text of one document).
    """
    max_tokens = seq_len - 3
    if max_tokens < 2:
        raise ValueError(f"seq_len must be >= 5 ([CLS] A [SEP] B [SEP]), got {seq_len}")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob!r}")
    rng = np.random.default_rng([seed, 0x5E9])

    def target() -> int:
        return int(rng.integers(2, max_tokens + 1)) if rng.random() < short_seq_prob else max_tokens

    out: list[tuple[int, int, int]] = []
    for d in doc_ids:
        bounds = corpus.document_segments(int(d))  # (k+1,)
        units: list[int] = []  # unit end offsets; units tile the document
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            units.extend(range(int(lo) + max_tokens, int(hi), max_tokens))  # cut over-long segments
            units.append(int(hi))
        start, want, ends = int(bounds[0]), target(), []
        for i, end in enumerate(units):
            ends.append(end)
            if end - start >= want or i == len(units) - 1:
                if end - start >= 2:
                    if len(ends) >= 2:
                        split = ends[int(rng.integers(0, len(ends) - 1))]
                    else:
                        split = start + int(rng.integers(1, end - start))
                    out.append((start, split, end))
                start, want, ends = end, target(), []
    return np.asarray(out, dtype=np.int64).reshape(-1, 3)


def truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int, rng: np.random.Generator):
    """BERT's ``truncate_seq_pair``: trim the longer of A, B (from the front or back at random) until
    ``len(a) + len(b) <= max_tokens``."""
    while len(a) + len(b) > max_tokens:
        if len(a) >= len(b):
            a = a[1:] if rng.random() < 0.5 else a[:-1]
        else:
            b = b[1:] if rng.random() < 0.5 else b[:-1]
    return a, b


def mask_tokens(
    ids: np.ndarray,
    candidates: np.ndarray,
    rng: np.random.Generator,
    *,
    mask_id: int,
    replacement_ids: np.ndarray,
    prob: float = MASK_PROB,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking of ``ids`` (n,): ``max(1, round(prob·len(candidates)))`` of the ``candidates``
    positions (never special tokens: the caller excludes them) are predicted; of those 80% become
    ``mask_id``, 10% a random id from ``replacement_ids`` (non-special vocabulary), 10% stay.

    Returns the masked ids (n,) and labels (n,) with -100 at unpredicted positions.
    """
    k = max(1, round(prob * len(candidates)))
    pos = np.sort(rng.choice(candidates, size=k, replace=False))  # (k,)
    labels = np.full(len(ids), -100, dtype=np.int64)
    labels[pos] = ids[pos]
    out = ids.copy()
    u = rng.random(k)  # (k,)
    out[pos[u < 0.8]] = mask_id
    rand = pos[(u >= 0.8) & (u < 0.9)]
    out[rand] = replacement_ids[rng.integers(0, len(replacement_ids), size=len(rand))]
    return out, labels


class PretrainingDataset(Sequence):
    """Map-style MLM + SOP examples of one split; item ``i`` is a pure function of (seed, split, i).

    ``dupe_factor`` = k makes the split k times as long: item ``c·I + j`` (I segment pairs) is pair j with
    its c-th draw of masks, segment order and truncation (BERT's ``dupe_factor``). Why: with one draw per
    pair, a model trained for several epochs learns each example's masked tokens and SOP label by heart
    instead of the language (measured on Brown, Figure 5 from scratch: after 1600 steps, 12 epochs,
    softmax BERT-small reached 24 % MLM and 100 % SOP accuracy on its training examples with their own
    masks, 12.5 % and 44 % with fresh ones, the same as on dev). Copy 0 is the single-draw item.

    Items: ``input_ids``, ``token_type_ids``, ``labels`` (-100 = not predicted), all (n,) int64, and
    ``sentence_order_label`` () int64 (1 = the two segments were swapped).
    """

    def __init__(
        self,
        corpus: TokenizedCorpus,
        tokenizer: TextTokenizer,
        *,
        split: str,
        seq_len: int,
        dev_fraction: float = 0.05,
        short_seq_prob: float = SHORT_SEQ_PROB,
        seed: int = 0,
        dupe_factor: int = 1,
    ) -> None:
        if split not in SPLIT_SALT:
            raise ValueError(f"split must be one of {sorted(SPLIT_SALT)}, got {split!r}")
        if isinstance(dupe_factor, bool) or not isinstance(dupe_factor, int) or dupe_factor < 1:
            raise ValueError(f"dupe_factor must be an int >= 1, got {dupe_factor!r}")
        self.tok, self.seq_len, self.seed, self.salt = tokenizer, seq_len, seed, SPLIT_SALT[split]
        self.dupe_factor = dupe_factor
        self.tokens = corpus.tokens  # (t,)
        docs = split_documents(corpus.num_documents, dev_fraction)[split]
        self.instances = build_instances(
            corpus, docs, seq_len=seq_len, short_seq_prob=short_seq_prob, seed=seed * 2 + self.salt
        )  # (I, 3)
        if len(self.instances) == 0:
            raise ValueError(f"the {split} split of {corpus.folder} holds no example of >= 2 tokens")
        special = np.asarray(tokenizer.special_ids)
        self.replacement_ids = np.setdiff1d(np.arange(tokenizer.vocab_size), special)  # (v - specials,)

    @property
    def example_lengths(self) -> np.ndarray:
        """Tokens of each pair's example, the same for every draw: (I,). The pair is cut to L - 3 tokens
        whatever the draw trims, then ``[CLS] A [SEP] B [SEP]`` adds 3."""
        return np.minimum(self.instances[:, 2] - self.instances[:, 0], self.seq_len - 3) + 3

    def __len__(self) -> int:
        return len(self.instances) * self.dupe_factor

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} out of range [0, {len(self)})")
        copy, j = divmod(i, len(self.instances))
        rng = np.random.default_rng([self.seed, self.salt, j] if copy == 0 else [self.seed, self.salt, j, copy])
        start, split, end = (int(x) for x in self.instances[j])
        a = np.asarray(self.tokens[start:split], dtype=np.int64)
        b = np.asarray(self.tokens[split:end], dtype=np.int64)
        a, b = truncate_pair(a, b, self.seq_len - 3, rng)
        swapped = bool(rng.random() < 0.5)
        if swapped:
            a, b = b, a
        t = self.tok
        ids = np.concatenate([[t.cls_id], a, [t.sep_id], b, [t.sep_id]]).astype(np.int64)  # (n,)
        types = np.zeros(len(ids), dtype=np.int64)
        types[len(a) + 2 :] = 1
        candidates = np.concatenate([np.arange(1, len(a) + 1), np.arange(len(a) + 2, len(ids) - 1)])
        ids, labels = mask_tokens(
            ids, candidates, rng, mask_id=t.mask_id, replacement_ids=self.replacement_ids
        )
        return {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(types),
            "labels": torch.from_numpy(labels),
            "sentence_order_label": torch.tensor(int(swapped)),
        }


def collate_pretraining(items: list[dict], *, pad_id: int, pad_to: int) -> dict[str, torch.Tensor]:
    """Pad items to ``pad_to`` tokens: ``input_ids``, ``attention_mask`` (1 = real), ``token_type_ids``,
    ``labels`` (b, L) and ``sentence_order_label`` (b,). A fixed length keeps every batch (and every DDP
    rank) the same shape."""
    b = len(items)
    ids = torch.full((b, pad_to), pad_id, dtype=torch.long)  # (b, L)
    types = torch.zeros((b, pad_to), dtype=torch.long)
    labels = torch.full((b, pad_to), -100, dtype=torch.long)
    mask = torch.zeros((b, pad_to), dtype=torch.long)
    for r, item in enumerate(items):
        n = len(item["input_ids"])
        if n > pad_to:
            raise ValueError(f"example {r} has {n} tokens, more than pad_to={pad_to}")
        ids[r, :n], types[r, :n], labels[r, :n] = item["input_ids"], item["token_type_ids"], item["labels"]
        mask[r, :n] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types,
        "labels": labels,
        "sentence_order_label": torch.stack([i["sentence_order_label"] for i in items]),
    }
