"""Equal real tokens for the ``long-positions`` runs: what a training step of each layout feeds the model, and how
many steps a packed run needs to see the tokens a stream run sees.

Legend: L a run's row length, c = L - 2 content tokens per piece, b rows per step, D documents, P pieces,
R rows of one copy, k = ``dupe_factor`` copies, B the budget in real tokens.

A step's *real* tokens are its batch's non-padding tokens (``attention_mask`` ones, ``[CLS]``/``[SEP]``
included): what the training loop counts for its ``tokens_per_s``. A ``stream`` row is full (c + 2) but the
last piece of each copy, so a stream run of S steps sees S · b · L real tokens to within 0.1 %. A
``documents`` row holds whole documents first-fit, and at L = 4096 a Brown document (2,261-3,299 tokens)
sits alone in its row: about 37 % of a packed batch is padding. The budget is therefore counted in real
tokens: B = ``steps`` · ``tokens_per_step`` (the stream runs' count), and a packed run trains the fewest
steps whose real tokens reach B (:func:`steps_for_budget`), with the same rows per step, rate and schedule
shape. Everything here is exact: the training loop's batches are a pure function of (items, step, b, seed)
(:func:`nystrom_lab.training.loop.global_batch`) and the packed layout one of (lengths, L, seed).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from nystrom_lab.data.text import TextTokenizer, TokenizedCorpus
    from nystrom_lab.long_context.run import LongRun


def split_lengths(corpus: TokenizedCorpus, split: str, dev_fraction: float) -> np.ndarray:
    """Tokens of every document of ``split`` (``train`` or ``dev``), in the split's order: (D,) int64."""
    from nystrom_lab.data.text_pretrain import split_documents

    docs = split_documents(corpus.num_documents, dev_fraction)[split]
    bounds = [corpus.document_segments(int(d)) for d in docs]
    return np.asarray([int(b[-1] - b[0]) for b in bounds], dtype=np.int64)


def item_tokens(lengths: np.ndarray, *, layout: str, length: int, seed: int, copies: int) -> np.ndarray:
    """Real tokens of every training item of a run, in the loop's item order: (k · items of one copy,).

    ``stream``: the documents of ``lengths`` (D,) each followed by ``[SEP]``, cut into pieces of c tokens,
    each ``[CLS] piece [SEP]``; ``documents``: the documents cut into pieces of at most c tokens, each
    ``[CLS] piece [SEP]``, packed first-fit into L-token rows with ``seed``
    (:func:`~nystrom_lab.data.packing.pack_rows`). Every copy repeats the first one's lengths."""
    from nystrom_lab.data.packing import cut_lengths, pack_rows

    lengths = np.asarray(lengths, dtype=np.int64)
    c = length - 2
    if layout == "stream":
        total = int((lengths + 1).sum())  # (t,) the split's stream
        pieces = -(-total // c)
        one = np.full(pieces, length, dtype=np.int64)
        one[-1] = total - (pieces - 1) * c + 2
    elif layout == "documents":
        _, _, piece = cut_lengths(lengths, c)  # (P,)
        one = pack_rows(piece + 2, length, seed=seed).row_lengths  # (R,)
    else:
        raise ValueError(f"layout must be stream or documents, got {layout!r}")
    return np.tile(one, copies)


def step_tokens(items: np.ndarray, steps: int, *, batch: int, seed: int) -> np.ndarray:
    """Real tokens of each of the first ``steps`` steps of the training loop over ``items`` (n,): (steps,)."""
    from nystrom_lab.training.loop import global_batch

    n = len(items)
    return np.asarray(
        [int(items[global_batch(n, s, batch, seed)].sum()) for s in range(steps)], dtype=np.int64
    )


def steps_for_budget(items: np.ndarray, budget: int, *, batch: int, seed: int) -> int:
    """The fewest steps of the training loop over ``items`` (n,) whose real tokens reach ``budget``."""
    from nystrom_lab.training.loop import global_batch

    if budget <= 0:
        raise ValueError(f"the budget must be positive, got {budget}")
    if int(items.max(initial=0)) <= 0:
        raise ValueError("the training items hold no tokens: no number of steps reaches the budget")
    n, seen, step = len(items), 0, 0
    while seen < budget:
        seen += int(items[global_batch(n, step, batch, seed)].sum())
        step += 1
    return step


def tokenizer_path(run: LongRun) -> Path:
    """The tokenizer every variant uses: the trained source's (``OUT/source/model``), else MiniLM's (the same
    vocabulary: the source's folder is MiniLM's file rewritten)."""
    own = run.out / "source" / "model" / "tokenizer.json"
    if own.is_file():
        return own
    from nystrom.model import minilm_path

    return minilm_path() / "tokenizer.json"


def token_cache(run: LongRun) -> tuple[TokenizedCorpus, TextTokenizer]:
    """The corpus tokenised by :func:`tokenizer_path` into ``OUT/cache/tokens-<sha>`` (one cache per tokenizer
    file, so that the source's and MiniLM's never meet in one folder), and the tokenizer."""
    from nystrom_lab.data.text import build_token_cache, load_tokenizer
    from nystrom_lab.data.text_corpus import resolve_corpus

    tok = load_tokenizer(tokenizer_path(run))
    sha = hashlib.sha256(tok.path.read_bytes()).hexdigest()[:12]
    files = resolve_corpus(list(run.corpus), run.out / "cache")
    return build_token_cache(files, tok, run.out / "cache" / f"tokens-{sha}", doc_mode="blank"), tok


@functools.lru_cache(maxsize=16)
def _train_lengths(run: LongRun) -> np.ndarray:
    """The training documents' lengths (tokenised once per run and process)."""
    cache, _ = token_cache(run)
    return split_lengths(cache, "train", run.dev_fraction)


def run_items(run: LongRun, variant: str) -> np.ndarray:
    """Real tokens of every training item of ``variant``'s run (its layout, length, seed and copies)."""
    lengths = _train_lengths(run)
    return item_tokens(
        lengths, layout=run.layout(variant), length=run.length(variant), seed=run.train_seed(variant),
        copies=run.dupe_factor,
    )  # fmt: skip


def budget_steps(run: LongRun, variant: str) -> int:
    """Steps of a packed ``variant`` that see ``run.steps · run.tokens_per_step`` real tokens."""
    batch = run.tokens_per_step // run.length(variant)
    items = run_items(run, variant)
    return steps_for_budget(items, run.steps * run.tokens_per_step, batch=batch, seed=run.train_seed(variant))


def real_tokens(run: LongRun, variant: str, steps: list[int]) -> list[int]:
    """Real tokens ``variant``'s run has fed the model after each of ``steps`` (exact; 0 at step 0)."""
    batch = run.tokens_per_step // run.length(variant)
    last = max(steps, default=0)
    seen = np.concatenate([[0], np.cumsum(step_tokens(run_items(run, variant), last, batch=batch,
                                                      seed=run.train_seed(variant)))])  # fmt: skip
    return [int(seen[s]) for s in steps]
