"""Masked-LM examples of whole documents, one per document piece: the items that rows pack without cross-talk.

Legend: L sequence length (``seq_len``), c = L - 2 content tokens per piece, R reference length, P pieces.

Every document of the split is an example ``[CLS] tokens [SEP]``; a document of more than c tokens is cut
into consecutive pieces of c (the last shorter), each an example of its own (it does not see the
document's other pieces). :class:`~nystrom_lab.data.packed_batches.PackedRows` packs these examples into
L-token rows (``--packing documents``), or a batch pads them one per row (``--packing off``); the
stream of :class:`~nystrom_lab.data.text_mlm.PackedMLMDataset` (``--packing stream``) cuts the same
documents across rows instead, so that a row's documents see each other.

Masks follow :class:`~nystrom_lab.data.text_mlm.PackedMLMDataset`'s rules, and evaluation masks are the
very same: drawn once over the split's stream from ``(seed, split)``, so a dev token is masked the same
way under every layout and length. ``positions`` (n,) keys a token by its place in its document cut into
R-token pieces (``reference_length``, default L): 0 for ``[CLS]``, 1 + (offset in the document mod
(R - 2)) for a content token, one more for ``[SEP]``; for L = R it is the token's own position.
"""

from __future__ import annotations

import numpy as np
import torch

from nystrom_lab.data.packing import cut_lengths
from nystrom_lab.data.text import TextTokenizer, TokenizedCorpus
from nystrom_lab.data.text_mlm import PackedMLMDataset
from nystrom_lab.data.text_pretrain import split_documents


class DocumentMLMDataset(PackedMLMDataset):
    """Map-style MLM examples, one per document piece of one split; item ``c·P + j`` is piece j with its
    c-th draw of masks (``dupe_factor``), a pure function of ``(seed, split, j, c)``.

    Items: ``input_ids``, ``labels`` (-100 = not predicted) and ``positions``, all (n,) int64, n <= L;
    :attr:`example_lengths` (P,) gives every piece's n without building it.
    """

    def __init__(
        self,
        corpus: TokenizedCorpus,
        tokenizer: TextTokenizer,
        *,
        split: str,
        dev_fraction: float = 0.05,
        **kwargs,
    ) -> None:
        # the split's stream (documents each followed by [SEP]), its fixed masks, the option checks
        super().__init__(corpus, tokenizer, split=split, dev_fraction=dev_fraction, **kwargs)
        docs = split_documents(corpus.num_documents, dev_fraction)[split]
        bounds = [corpus.document_segments(int(d)) for d in docs]
        tokens = np.asarray([int(b[-1] - b[0]) for b in bounds], dtype=np.int64)  # (D,)
        starts = np.concatenate([[0], np.cumsum(tokens + 1)[:-1]]).astype(np.int64)  # (D,) in the stream
        doc, start, length = cut_lengths(tokens, self.content)  # (P,) each
        if len(doc) == 0:
            raise ValueError(f"the documents of {corpus.folder} in this split hold no tokens")
        self.piece_start = starts[doc] + start  # (P,) offsets in the stream
        self.piece_offset = start  # (P,) offsets in the document
        self.piece_length = length  # (P,) content tokens
        self.pieces = len(doc)

    @property
    def example_lengths(self) -> np.ndarray:
        """Tokens of each piece's example, ``[CLS]`` and ``[SEP]`` included: (P,)."""
        return self.piece_length + 2

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} out of range [0, {len(self)})")
        copy, j = divmod(i, self.pieces)
        lo = int(self.piece_start[j])
        hi = lo + int(self.piece_length[j])
        if self.stream_masked is not None:
            body, body_labels = self.stream_masked[lo:hi], self.stream_labels[lo:hi]
        else:
            body, body_labels = self.draw_masks(
                self.stream[lo:hi], np.random.default_rng([self.seed, self.salt, j, copy])
            )
        t = self.tok
        ids = np.concatenate([[t.cls_id], body, [t.sep_id]]).astype(np.int64)  # (n,)
        labels = np.concatenate([[-100], body_labels, [-100]]).astype(np.int64)
        offset = int(self.piece_offset[j]) + np.arange(hi - lo)  # content tokens' offsets in the document
        ref = 1 + np.mod(offset, self.reference_length - 2)
        positions = np.concatenate([[0], ref, [ref[-1] + 1]])  # (n,)
        return {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "positions": torch.from_numpy(positions.astype(np.int64)),
        }
