"""Brown genre classification: one labelled example per Brown file, as CSV tables ``nystrom finetune`` reads.

Every Brown file (``ca01`` ... ``cr09``, 500 documents of about 2,000 words, 2,600 WordPiece tokens) is
one example: the whole document's text (sentences detokenised as in :mod:`nystrom_lab.data.brown`, joined by
spaces), its genre letter, and its label: one of the corpus's four standard groups (Francis & Kučera's
manual: *informative prose* = press A–C, general non-fiction D–H, learned J; *imaginative prose* =
fiction K–R).

Split (deterministic, stratified by genre letter): within each letter's files in name order, every 5th
(indices 4, 9, ...) is ``test``, indices 1, 11, 21, ... are ``validation`` and the rest is ``train``:
353 / 54 / 93 documents (train / validation / test; test: 16 press, 40 non-fiction, 16 learned, 21
fiction). Genre M (science fiction) has 6 files, R (humour) 9: each still has one test and one
validation file.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from pathlib import Path

from nystrom_lab.data.brown import detokenize, read_brown_documents

#: genre letter -> (genre name, group label)
GENRES: dict[str, tuple[str, str]] = {
    "a": ("press: reportage", "press"),
    "b": ("press: editorial", "press"),
    "c": ("press: reviews", "press"),
    "d": ("religion", "nonfiction"),
    "e": ("skill and hobbies", "nonfiction"),
    "f": ("popular lore", "nonfiction"),
    "g": ("belles-lettres", "nonfiction"),
    "h": ("miscellaneous: government and house organs", "nonfiction"),
    "j": ("learned", "learned"),
    "k": ("general fiction", "fiction"),
    "l": ("mystery and detective fiction", "fiction"),
    "m": ("science fiction", "fiction"),
    "n": ("adventure and western fiction", "fiction"),
    "p": ("romance and love story", "fiction"),
    "r": ("humor", "fiction"),
}
SPLITS = ("train", "validation", "test")
COLUMNS = ("file", "genre", "genre_name", "label", "text")


def split_of(index: int) -> str:
    """The split of the ``index``-th file (0-based, name order) of its genre letter."""
    if index % 5 == 4:
        return "test"
    if index % 10 == 1:
        return "validation"
    return "train"


def genre_rows(source: str | os.PathLike[str]) -> dict[str, list[dict[str, str]]]:
    """``{split: [row, ...]}`` of the Brown files in ``source`` (rows hold :data:`COLUMNS`).

    Raises ``ValueError`` for a file whose genre letter is not one of Brown's 15 (e.g. ``ci01``)."""
    rows: dict[str, list[dict[str, str]]] = {s: [] for s in SPLITS}
    seen: dict[str, int] = {}
    for name, sentences in read_brown_documents(source):
        letter = name[1]
        if letter not in GENRES:
            raise ValueError(f"{Path(source) / name}: genre letter {letter!r} is not one of Brown's {''.join(GENRES)}")
        index = seen.get(letter, 0)
        seen[letter] = index + 1
        genre_name, label = GENRES[letter]
        text = " ".join(detokenize(words) for words in sentences)
        rows[split_of(index)].append({"file": name, "genre": letter, "genre_name": genre_name, "label": label,
                                      "text": text})  # fmt: skip
    return rows


def write_brown_genres(source: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> dict[str, dict]:
    """Write ``out_dir/{train,validation,test}.csv`` (:data:`COLUMNS`) and return, per split, the number of
    documents and of documents per label."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {}
    for split, rows in genre_rows(source).items():
        target = out_dir / f"{split}.csv"
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        with tmp.open("w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, target)
        counts = Counter(row["label"] for row in rows)
        summary[split] = {"documents": len(rows), "labels": dict(sorted(counts.items()))}
    return summary
