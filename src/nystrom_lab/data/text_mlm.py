"""Masked-LM examples of whole documents packed into fixed-length pieces (long-context pre-training).

Legend: L sequence length (``seq_len``), c = L - 2 content tokens per piece, R reference length, k masked
positions, b batch.

The documents of one split form one token stream, each followed by ``[SEP]`` (so a document shorter than
a piece is packed with the next one, separated, and one longer than a piece is cut across pieces); piece
j is ``[CLS] stream[j·c : (j+1)·c] [SEP]``, the last one shorter. Every stream token appears in exactly one
piece, so nothing is dropped or repeated within an epoch.

Masks (BERT's 15 %, 80/10/10, never on special tokens):

- training (``fixed_masks=False``): drawn per item from ``(seed, split, piece, copy)``; ``dupe_factor``
  copies of every piece carry independent draws (BERT's ``dupe_factor``), so a run of several epochs
  sees fresh masks instead of learning the same ones by heart;
- evaluation (``fixed_masks=True``): drawn once over the whole stream from ``(seed, split)``, so every
  ``seq_len`` scores the *same* tokens with the *same* corruption. A 512-token model evaluated on the
  held-out documents cut into 512-token windows is scored on exactly the tokens a 4096-token model is.

Items also carry ``positions`` (n,): each token's position in the stream cut into R-token pieces
(``reference_length``, default L), the key of the per-position-bucket metrics; for L = R it is the
token's own position.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from nystrom_lab.data.constants import MASK_PROB, SPLIT_SALT
from nystrom_lab.data.text import TextTokenizer, TokenizedCorpus
from nystrom_lab.data.text_pretrain import mask_tokens, split_documents


def document_stream(corpus: TokenizedCorpus, doc_ids: np.ndarray, *, sep_id: int) -> np.ndarray:
    """The tokens of documents ``doc_ids`` in order, each followed by ``sep_id``: (t,) int64."""
    parts = []
    for d in doc_ids:
        bounds = corpus.document_segments(int(d))  # (s+1,) token offsets
        parts.append(np.asarray(corpus.tokens[int(bounds[0]) : int(bounds[-1])], dtype=np.int64))
        parts.append(np.asarray([sep_id], dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def position_buckets(reference_length: int, *, first: int = 512) -> tuple[int, ...]:
    """Bucket edges ``(0, first, 2·first, 4·first, ..., R)``: [0, 512), [512, 1024), [1024, 2048), ..."""
    if reference_length < 1:
        raise ValueError(f"reference_length must be >= 1, got {reference_length}")
    edges, e = [0], first
    while e < reference_length:
        edges.append(e)
        e *= 2
    return (*edges, reference_length)


def bucket_label(lo: int, hi: int) -> str:
    return f"[{lo}, {hi})"


class PackedMLMDataset(Sequence):
    """Map-style MLM examples of one split of a corpus; item ``i`` is a pure function of
    ``(seed, split, i)`` (see the module docstring for the packing and masking).

    Items: ``input_ids``, ``labels`` (-100 = not predicted) and ``positions``, all (n,) int64, n <= L.
    """

    def __init__(
        self,
        corpus: TokenizedCorpus,
        tokenizer: TextTokenizer,
        *,
        split: str,
        seq_len: int,
        dev_fraction: float = 0.05,
        seed: int = 0,
        dupe_factor: int = 1,
        fixed_masks: bool = False,
        reference_length: int | None = None,
        mask_prob: float = MASK_PROB,
    ) -> None:
        if split not in SPLIT_SALT:
            raise ValueError(f"split must be one of {sorted(SPLIT_SALT)}, got {split!r}")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 3:
            raise ValueError(f"seq_len must be an int >= 3 ([CLS] tokens [SEP]), got {seq_len!r}")
        if isinstance(dupe_factor, bool) or not isinstance(dupe_factor, int) or dupe_factor < 1:
            raise ValueError(f"dupe_factor must be an int >= 1, got {dupe_factor!r}")
        ref = seq_len if reference_length is None else reference_length
        if isinstance(ref, bool) or not isinstance(ref, int) or ref < 3:
            raise ValueError(f"reference_length must be an int >= 3, got {reference_length!r}")
        self.tok, self.seq_len, self.reference_length = tokenizer, seq_len, ref
        self.seed, self.salt, self.dupe_factor, self.mask_prob = (
            seed,
            SPLIT_SALT[split],
            dupe_factor,
            mask_prob,
        )
        docs = split_documents(corpus.num_documents, dev_fraction)[split]
        self.stream = document_stream(corpus, docs, sep_id=tokenizer.sep_id)  # (t,)
        self.content = seq_len - 2
        self.pieces = -(-len(self.stream) // self.content)
        if self.pieces == 0:
            raise ValueError(f"the {split} split of {corpus.folder} holds no tokens")
        self._special = np.asarray(tokenizer.special_ids)
        self.replacement_ids = np.setdiff1d(np.arange(tokenizer.vocab_size), self._special)
        self.stream_masked: np.ndarray | None = None
        self.stream_labels: np.ndarray | None = None
        if fixed_masks:
            self.stream_masked, self.stream_labels = self.draw_masks(
                self.stream, np.random.default_rng([seed, self.salt, 0x10C])
            )

    @property
    def num_tokens(self) -> int:
        """Tokens of the split's stream (documents + one separator each)."""
        return len(self.stream)

    def draw_masks(self, raw: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """BERT masks of the tokens ``raw`` (t,) (never special ones): masked ids (t,), labels (t,)."""
        candidates = np.flatnonzero(~np.isin(raw, self._special))
        if len(candidates) == 0:
            return raw, np.full(len(raw), -100, dtype=np.int64)
        return mask_tokens(
            raw, candidates, rng, mask_id=self.tok.mask_id, replacement_ids=self.replacement_ids,
            prob=self.mask_prob,
        )  # fmt: skip

    def __len__(self) -> int:
        return self.pieces * self.dupe_factor

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} out of range [0, {len(self)})")
        copy, j = divmod(i, self.pieces)
        lo, hi = j * self.content, min((j + 1) * self.content, len(self.stream))
        t = self.tok
        if self.stream_masked is not None:
            body, body_labels = self.stream_masked[lo:hi], self.stream_labels[lo:hi]
        else:
            body, body_labels = self.draw_masks(
                self.stream[lo:hi], np.random.default_rng([self.seed, self.salt, j, copy])
            )
        ids = np.concatenate([[t.cls_id], body, [t.sep_id]]).astype(np.int64)  # (n,)
        labels = np.concatenate([[-100], body_labels, [-100]]).astype(np.int64)
        ref = 1 + np.mod(np.arange(lo, hi), self.reference_length - 2)  # content tokens in R-token pieces
        positions = np.concatenate([[0], ref, [ref[-1] + 1]])  # (n,): [CLS] first, [SEP] after the last
        return {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "positions": torch.from_numpy(positions.astype(np.int64)),
        }


def collate_mlm(items: list[dict], *, pad_id: int, pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Right-pad items to ``pad_to`` (default: the longest): ``input_ids``, ``attention_mask`` (1 = real),
    ``labels`` (-100 at padding) and ``positions`` (b, L)."""
    n = max(len(it["input_ids"]) for it in items) if pad_to is None else pad_to
    b = len(items)
    ids = torch.full((b, n), pad_id, dtype=torch.long)  # (b, L)
    labels = torch.full((b, n), -100, dtype=torch.long)
    positions = torch.zeros((b, n), dtype=torch.long)
    mask = torch.zeros((b, n), dtype=torch.long)
    for r, item in enumerate(items):
        k = len(item["input_ids"])
        if k > n:
            raise ValueError(f"example {r} has {k} tokens, more than pad_to={n}")
        ids[r, :k], labels[r, :k], positions[r, :k] = item["input_ids"], item["labels"], item["positions"]
        mask[r, :k] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "positions": positions}
