"""Fixtures the text-data tests share: a WordPiece tokenizer trained on the fixture corpus, and a tokenised
corpus of documents shorter and longer than the rows the tests cut (module-scoped: built once per module)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from nystrom_lab.data.text import build_token_cache, train_wordpiece

CORPUS = Path(__file__).parents[2] / "fixtures" / "text" / "corpus"
FILES = sorted(CORPUS.glob("*.txt"))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_wordpiece(FILES, tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tok):
    """60 documents of 2-12 fixture sentences (deterministic), tokenised: shorter and longer than the rows."""
    lines = [ln for f in FILES for ln in f.read_text().splitlines() if ln]
    rnd = random.Random(0)
    docs = ["\n".join(rnd.sample(lines, rnd.randint(2, 12))) for _ in range(60)]
    path = tmp_path_factory.mktemp("docs") / "docs.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return build_token_cache([path], tok, path.parent / "cache")
