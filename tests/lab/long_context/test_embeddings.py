"""The long-document embedding task's inputs (nystrom_lab.long_context.embeddings): halves, the train /
held-out split, reading a Brown folder, cutting and chunking by tokens, and the command's refusals."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from nystrom.model import minilm_path
from nystrom_lab.long_context import embeddings
from nystrom_lab.long_context.embeddings import chunks, cut_tokens, halve, read_corpus, split_documents

NAMES = ["ca01", "ca02", "cb01", "cf03", "cj10", "cn07"]


def _brown(tmp_path, names=NAMES, documents=None):
    """A Brown folder as ``nystrom data brown`` writes it: brown.txt (documents of sentence lines, blank
    lines between) and brown.json naming the source folder of the corpus files."""
    source = tmp_path / "source"
    source.mkdir()
    for name in names:
        (source / name).write_text("x/nn\n")
    (source / "CONTENTS").write_text("not a corpus file\n")
    docs = documents or [f"Doc {i} opens here.\nIt goes on a while.\nAnd it ends." for i in range(len(names))]
    folder = tmp_path / "brown"
    folder.mkdir()
    (folder / "brown.txt").write_text("\n\n".join(docs) + "\n")
    (folder / "brown.json").write_text(json.dumps({"source": str(source)}))
    return folder


def test_halves_split_at_the_sentence_nearest_half_the_characters():
    assert halve(["a" * 10, "b" * 10, "c" * 10, "d" * 10]) == ("a" * 10 + " " + "b" * 10, "c" * 10 + " " + "d" * 10)
    assert halve(["a" * 30, "b", "c"]) == ("a" * 30, "b c")  # the first sentence is past half: cut after it
    assert halve(["a", "b" * 30]) == ("a", "b" * 30)  # both halves keep a sentence
    with pytest.raises(ValueError, match="1 sentence"):
        halve(["only one"])


def test_the_split_is_by_parity_disjoint_and_whole():
    train, held = split_documents(7)
    assert train == [0, 2, 4, 6] and held == [1, 3, 5]


@pytest.mark.parametrize("split, picked", [("all", NAMES), ("train", NAMES[0::2]), ("held-out", NAMES[1::2])])
def test_read_corpus_labels_and_splits(tmp_path, split, picked):
    corpus = read_corpus(_brown(tmp_path), documents=None, split=split)
    assert corpus.names == picked
    assert corpus.letter == [n[1] for n in picked]
    assert corpus.group[:1] == ["press"]  # ca01 / cb01 are press
    i = NAMES.index(picked[0])
    # 18 + 20 + 13 characters: the cut after the first sentence (18) is nearest to half (25.5)
    assert corpus.first[0] == f"Doc {i} opens here." and corpus.second[0] == "It goes on a while. And it ends."
    assert corpus.whole[0] == f"Doc {i} opens here. It goes on a while. And it ends."


def test_read_corpus_spreads_a_subset_and_refuses_bad_folders(tmp_path):
    assert read_corpus(_brown(tmp_path), documents=3, split="all").names == ["ca01", "cb01", "cn07"]
    with pytest.raises(ValueError, match="split must be one of"):
        read_corpus(tmp_path / "brown", documents=None, split="test")
    (tmp_path / "brown" / "brown.txt").write_text("One.\nTwo.\n")  # 1 document, 6 source files
    with pytest.raises(ValueError, match="holds 1 documents but .* has 6 Brown files"):
        read_corpus(tmp_path / "brown", documents=None)
    with pytest.raises(FileNotFoundError, match="lacks brown.txt or brown.json"):
        read_corpus(tmp_path, documents=None)


def test_cut_and_chunks_count_wordpiece_tokens():
    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    text = "Unbelievably, the antidisestablishmentarianism debate continued " * 20
    count = lambda t: len(tok(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    (cut,) = cut_tokens([text], tok, 17)
    assert count(cut) == 17 and text.startswith(cut)
    assert cut_tokens(["short text"], tok, 17) == ["short text"]
    pieces = chunks(text, tok, 16)
    assert all(count(p) <= 16 for p in pieces) and len(pieces) >= count(text) // 16
    assert "".join("".join(pieces).split()) == "".join(text.split())  # every character once, in order
    at = 0
    for piece in pieces:  # no piece starts inside a word: a letter before it and a letter at its start
        at = text.index(piece, at)
        assert at == 0 or not (text[at - 1].isalnum() and text[at].isalnum()), (at, piece[:20])
        at += len(piece)
    assert chunks("", tok, 16) == [""]


def test_the_command_refuses_an_also_folder_without_modules_json(tmp_path, capsys):
    folder = _brown(tmp_path)
    with pytest.raises(SystemExit):
        embeddings.main(["--brown", str(folder), "--also", f"mine={tmp_path}", "--out", str(tmp_path / "o")])
    assert "--also mine=" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        embeddings.main(["--brown", str(folder), "--also", "no-folder-given"])
    assert "expected NAME=FOLDER" in capsys.readouterr().err
