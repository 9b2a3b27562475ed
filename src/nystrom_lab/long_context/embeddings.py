"""``python -m nystrom_lab.long_context.embeddings``: long-document embeddings on Brown, through
sentence-transformers.

Legend: D documents, N the long model's length (4096), T the short model's (256).

Each Brown document (``brown.txt`` of ``nystrom data brown DIR``: 500 documents of about 2,600 WordPiece
tokens; genre letters from the file names of ``brown.json``'s source folder) is split at the sentence
boundary nearest to half its characters. Three embedders, all with all-MiniLM-L6-v2's tokenizer, mean
pooling and normalisation:

- ``long-{N}``: all-MiniLM-L6-v2 converted to N positions (``nystrom convert long --sentence-transformers``:
  copied positions, windows below, Nyström above; no training) on whole halves and documents;
- ``minilm-{T}``: all-MiniLM-L6-v2 as it is, each input cut to its first T tokens;
- ``minilm-chunks-{T}``: all-MiniLM-L6-v2 on consecutive T-token chunks (cut at word starts), the mean of the
  chunk embeddings.

Scored (:mod:`nystrom_lab.long_context.embeddings_metrics`) by half-document retrieval (top-1, MRR) and
genre k-NN over whole documents; OUT/embeddings.json and OUT/embeddings.md (also printed).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nystrom_lab.argtypes import ArgumentParser, existing_dir, output_dir, positive_int, positive_ints
from nystrom_lab.long_context import embeddings_metrics as metrics

SHORT = 256  # all-MiniLM-L6-v2's max_seq_length
DEFAULT_LONG_MODEL = Path("experiments/long-context/models/minilm-4096-st")  # git-ignored
SHORT_BATCH = 64
#: documents whose index has this parity may train (``embeddings_contrastive``); the others are held out
TRAIN_PARITY = 0
SPLITS = ("all", "train", "held-out")


def split_documents(count: int) -> tuple[list[int], list[int]]:
    """(training, held-out) document indices of a corpus of ``count`` documents."""
    train = [i for i in range(count) if i % 2 == TRAIN_PARITY]
    return train, [i for i in range(count) if i % 2 != TRAIN_PARITY]


@dataclass(frozen=True)
class Corpus:
    """D documents: ``first``/``second`` halves, ``whole`` (the halves joined), ``group`` and ``letter``."""

    names: list[str]
    first: list[str]
    second: list[str]
    group: list[str]
    letter: list[str]

    @property
    def whole(self) -> list[str]:
        return [f"{a} {b}" for a, b in zip(self.first, self.second)]


def halve(lines: list[str]) -> tuple[str, str]:
    """A document's sentences split at the boundary nearest to half its characters (both halves non-empty)."""
    if len(lines) < 2:
        raise ValueError(f"a document of {len(lines)} sentence(s) has no two halves")
    sizes = np.cumsum([len(s) + 1 for s in lines])
    cut = int(np.clip(np.argmin(np.abs(sizes - sizes[-1] / 2)) + 1, 1, len(lines) - 1))
    return " ".join(lines[:cut]), " ".join(lines[cut:])


def read_corpus(brown: Path, *, documents: int | None, split: str = "all") -> Corpus:
    """``brown/brown.txt`` as halves with labels; ``split`` (:data:`SPLITS`): every document, the ones a
    contrastive continuation trains on, or the others; ``documents``: that many of them, spread evenly."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    from nystrom_lab.data.brown import brown_files
    from nystrom_lab.data.brown_genres import GENRES

    text, info = brown / "brown.txt", brown / "brown.json"
    if not (text.is_file() and info.is_file()):
        raise FileNotFoundError(
            f"{brown} lacks brown.txt or brown.json: run `nystrom data brown {brown} --fetch`"
        )
    docs = [d.splitlines() for d in text.read_text(encoding="utf-8").strip().split("\n\n")]
    names = [p.name for p in brown_files(json.loads(info.read_text())["source"])]
    if len(names) != len(docs):
        raise ValueError(
            f"{text} holds {len(docs)} documents but {info}'s source has {len(names)} Brown files: rewrite it"
            f" with `nystrom data brown {brown}`"
        )
    pool = list(range(len(docs))) if split == "all" else split_documents(len(docs))[split == "held-out"]
    keep = range(len(pool)) if documents is None else np.linspace(0, len(pool) - 1, min(documents, len(pool)))
    picked = sorted({pool[round(float(i))] for i in keep})
    halves = [halve(docs[i]) for i in picked]
    return Corpus(
        names=[names[i] for i in picked], first=[h[0] for h in halves], second=[h[1] for h in halves],
        group=[GENRES[names[i][1]][1] for i in picked], letter=[names[i][1] for i in picked],
    )  # fmt: skip


def cut_tokens(texts: list[str], tokenizer, limit: int) -> list[str]:
    """Each text cut after its first ``limit`` tokens (no special tokens counted)."""
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    return [
        t if len(off) <= limit else t[: off[limit - 1][1]] for t, off in zip(texts, enc["offset_mapping"])
    ]


def chunks(text: str, tokenizer, size: int) -> list[str]:
    """``text`` as consecutive pieces of at most ``size`` tokens, each starting at a word (not a ## piece)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    pieces, off = tokenizer.convert_ids_to_tokens(enc["input_ids"]), enc["offset_mapping"]
    out, start = [], 0
    while start < len(off):
        end = min(start + size, len(off))
        while start + 1 < end < len(off) and pieces[end].startswith("##"):
            end -= 1
        out.append(text[off[start][0] : off[end - 1][1]])
        start = end
    return out or [text]


def encode(model, texts: list[str], *, batch_size: int, label: str) -> tuple[np.ndarray, dict]:
    """Embeddings (len(texts), e) with sentence-transformers' progress bar, and the inputs' token counts."""
    lengths = [len(ids) for ids in model.tokenizer(texts, verbose=False)["input_ids"]]
    print(f"[embeddings] {label}: {len(texts)} inputs, {sum(lengths)} tokens", file=sys.stderr)
    wall, cpu = time.perf_counter(), time.process_time()
    emb = model.encode(texts, batch_size=batch_size, show_progress_bar=True, convert_to_numpy=True)
    cut = sum(n > model.max_seq_length for n in lengths)
    kept = sum(min(n, model.max_seq_length) for n in lengths)
    return emb, {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu,
                 "inputs": len(texts), "tokens": kept, "cut_inputs": cut}  # fmt: skip


def _add(a: dict, b: dict) -> dict:
    return {k: a.get(k, 0) + v for k, v in b.items()}


def embed(model, corpus: Corpus, *, chunked: bool, batch_size: int, name: str) -> tuple[dict, dict]:
    """``{"first", "second", "whole"}`` -> (D, e) embeddings, and the cost; ``chunked``: mean over chunks."""
    sets = {"first": corpus.first, "second": corpus.second, "whole": corpus.whole}
    out, cost = {}, {}
    for key, texts in sets.items():
        if not chunked:
            out[key], c = encode(model, texts, batch_size=batch_size, label=f"{name} {key}")
        else:
            pieces = [chunks(t, model.tokenizer, model.max_seq_length - 2) for t in texts]
            flat, c = encode(
                model, [p for ps in pieces for p in ps], batch_size=batch_size, label=f"{name} {key}"
            )
            bounds = np.cumsum([0] + [len(ps) for ps in pieces])
            out[key] = np.stack([metrics.unit(flat[a:b]).mean(0) for a, b in zip(bounds[:-1], bounds[1:])])
        cost = _add(cost, c)
    return out, cost


def long_model(path: Path, *, max_length: int) -> Path:
    """The converted long model at ``path``, written first (from all-MiniLM-L6-v2) when absent."""
    if path.exists() and not (path / "modules.json").is_file():
        raise FileNotFoundError(
            f"--long-model {path} exists but is no sentence-transformers folder (no modules.json): add its files"
            " with nystrom.convert.sentence_transformers.write_sentence_transformers, or name a new folder"
        )
    if not path.exists():
        from nystrom_lab.cli import run_command

        print(
            f"[embeddings] converting all-MiniLM-L6-v2 to {max_length} positions into {path}", file=sys.stderr
        )
        run_command(["convert", "long", "--init-from", "minilm", "--max-length", str(max_length), "--out",
                     str(path), "--sentence-transformers"])  # fmt: skip
    return path


def run(
    corpus: Corpus, *, long_path: Path, batch_size: int, ks: tuple[int, ...], half_tokens: int | None,
    command: str, toy: bool, also: dict[str, Path] | None = None, split: str = "all",
) -> dict:  # fmt: skip
    """Embed with the three variants and score them; the results dict (``embeddings_metrics.render``)."""
    import torch
    from sentence_transformers import SentenceTransformer

    import nystrom  # noqa: F401  (registers our model with transformers' Auto classes)
    from nystrom.model import minilm_path

    short = SentenceTransformer(str(minilm_path()), device="cpu")
    long = SentenceTransformer(str(long_path), device="cpu")
    if half_tokens:
        corpus = Corpus(corpus.names, cut_tokens(corpus.first, short.tokenizer, half_tokens),
                        cut_tokens(corpus.second, short.tokenizer, half_tokens), corpus.group, corpus.letter)  # fmt: skip
    extra = {name: SentenceTransformer(str(path), device="cpu") for name, path in (also or {}).items()}
    setups = {
        f"long-{long.max_seq_length}": (long, False, batch_size, f"whole (≤ {long.max_seq_length} tokens)"),
        **{name: (m, False, batch_size, f"whole (≤ {m.max_seq_length} tokens)") for name, m in extra.items()},
        f"minilm-{short.max_seq_length}": (short, False, SHORT_BATCH, f"first {short.max_seq_length} tokens"),
        f"minilm-chunks-{short.max_seq_length}": (short, True, SHORT_BATCH, f"mean of {short.max_seq_length}-token chunks"),
    }  # fmt: skip
    variants = {}
    for name, (model, chunked, batch, how) in setups.items():
        emb, cost = embed(model, corpus, chunked=chunked, batch_size=batch, name=name)
        variants[name] = {
            "how": how, **cost, "tokens_per_input": cost["tokens"] / cost["inputs"],
            "retrieval": metrics.half_retrieval(emb["first"], emb["second"]),
            "genre_group": {str(k): metrics.knn_accuracy(emb["whole"], corpus.group, k=k) for k in ks},
            "genre_letter": {str(k): metrics.knn_accuracy(emb["whole"], corpus.letter, k=k) for k in ks},
        }  # fmt: skip
    d = len(corpus.names)
    return {
        "settings": {"long_model": str(long_path), "also": {k: str(v) for k, v in (also or {}).items()},
                     "split": split, "batch_size": batch_size, "k": list(ks), "half_tokens": half_tokens,
                     "threads": torch.get_num_threads(), "command": command, "toy": toy},
        "documents": d, "files": corpus.names, "variants": variants,
        "chance": {"top1": 1 / (2 * d - 1), "group": metrics.majority_share(corpus.group),
                   "letter": metrics.majority_share(corpus.letter)},
    }  # fmt: skip


def _named_path(text: str) -> tuple[str, Path]:
    """``NAME=FOLDER`` -> (name, path)."""
    name, sep, path = text.partition("=")
    if not (sep and name and path):
        raise argparse.ArgumentTypeError(f"expected NAME=FOLDER, got {text!r}")
    return name, Path(path)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m nystrom_lab.long_context.embeddings", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--brown", type=existing_dir, default=Path("data/brown"),
                   help="folder of `nystrom data brown` (brown.txt, brown.json; default data/brown)")  # fmt: skip
    p.add_argument("--long-model", type=Path, default=DEFAULT_LONG_MODEL,
                   help=f"sentence-transformers folder of the long model, converted there when absent (default {DEFAULT_LONG_MODEL})")  # fmt: skip
    p.add_argument(
        "--max-length", type=positive_int, default=4096, help="positions of a long model converted here"
    )
    p.add_argument(
        "--documents", type=positive_int, help="use this many documents, spread over the corpus (default all)"
    )
    p.add_argument("--split", choices=SPLITS, default="all",
                   help="all documents, or those a contrastive continuation trains on (train: even index) or never"
                   " sees (held-out: odd index) (default all)")  # fmt: skip
    p.add_argument("--also", type=_named_path, action="append", default=[], metavar="NAME=FOLDER",
                   help="one more sentence-transformers folder scored on whole inputs (e.g. a contrastive "
                   "continuation's OUT/model); repeat for more")  # fmt: skip
    p.add_argument(
        "--half-tokens", type=positive_int, help="cut each half to its first T tokens (default: whole)"
    )
    p.add_argument("--batch-size", type=positive_int, default=8,
                   help="inputs per forward of the long model (default 8: about 0.4 GB each at 4K tokens on CPU)")  # fmt: skip
    p.add_argument(
        "--k", type=positive_ints, default=[1, 5], help="k of the genre k-NN, comma-separated (default 1,5)"
    )
    p.add_argument("--out", type=output_dir, default=Path("experiments/long-context/embeddings"),
                   help="folder of embeddings.json and embeddings.md")  # fmt: skip
    a = p.parse_args(argv)
    try:  # a missing corpus or a wrong --long-model: one line, before any model is loaded
        corpus = read_corpus(a.brown, documents=a.documents, split=a.split)
        for name, path in a.also:
            if not (path / "modules.json").is_file():
                raise FileNotFoundError(f"--also {name}={path}: no sentence-transformers folder (no modules.json)")
        long_path = long_model(a.long_model, max_length=a.max_length)
    except (FileNotFoundError, ValueError) as err:
        p.error(str(err))
    words = sys.argv[1:] if argv is None else argv
    res = run(
        corpus, long_path=long_path, batch_size=a.batch_size,
        ks=tuple(a.k), half_tokens=a.half_tokens, command=" ".join([p.prog, *map(shlex.quote, words)]),
        toy=a.documents is not None or a.half_tokens is not None, also=dict(a.also), split=a.split,
    )  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "embeddings.json").write_text(json.dumps(res, indent=1) + "\n")
    report = metrics.render(res)
    (a.out / "embeddings.md").write_text(report)
    print(report, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
