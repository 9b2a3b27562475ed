"""DataFileError and the shared checks; GLUE/IMDB text, corpus, tokenizer and token-cache readers reject
bad files at load time naming file and line (regression tests for the readers' robustness fixes)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from nystrom_lab.data import DataFileError
from nystrom_lab.data.file_checks import path_inside
from nystrom_lab.data.glue import load_glue_file, load_imdb_reviews, read_tsv
from nystrom_lab.data.text import (
    TokenizedCorpus,
    build_token_cache,
    iter_documents,
    load_tokenizer,
    train_wordpiece,
)

FIX = Path(__file__).parents[2] / "fixtures" / "text"


def test_data_file_error_carries_path_and_line() -> None:
    err = DataFileError("/d/x.tsv", "bad label", line=7)
    assert isinstance(err, ValueError)
    assert str(err) == "/d/x.tsv line 7: bad label" and err.path == Path("/d/x.tsv") and err.line == 7
    assert str(DataFileError("/d/x.bin", "empty")) == "/d/x.bin: empty"
    back = pickle.loads(pickle.dumps(err))  # crosses process boundaries (DataLoader / Pool workers)
    assert (str(back), back.path, back.line, back.reason) == (str(err), err.path, 7, "bad label")


@pytest.mark.parametrize(
    "bad", ["", "../x", "a/../../x", "/etc/passwd", "a\\..\\..\\x", "C:x", "C:/x", "a\x00b"]
)
def test_path_inside_refuses_what_leaves_the_folder(tmp_path: Path, bad: str) -> None:
    with pytest.raises(DataFileError, match=r"m.txt line 3: path .* leaves the folder"):
        path_inside(tmp_path, bad, source=tmp_path / "m.txt", line=3)


def test_path_inside_keeps_relative_paths(tmp_path: Path) -> None:
    assert (
        path_inside(tmp_path, "imgs/0/sample_1.png", source=tmp_path / "m")
        == tmp_path / "imgs/0/sample_1.png"
    )
    assert path_inside(tmp_path, "a/./b..c", source=tmp_path / "m") == tmp_path / "a/b..c"


def _sst(tmp_path: Path, dev: bytes) -> Path:
    shutil.copytree(FIX / "glue" / "SST-2", tmp_path / "SST-2")
    (tmp_path / "SST-2" / "dev.tsv").write_bytes(dev)
    return tmp_path


@pytest.mark.parametrize(
    ("dev", "message"),
    [
        (b"", r"dev.tsv line 1: the file is empty"),
        (b"sentence\tlabel\n", r"dev.tsv: no examples after the header \(an empty split\)"),
        (b"sentence\tlabel\ngood\t1\n \t0\n", r"dev.tsv line 3: empty example"),
        (b"sentence\tlabel\ngood\t1\nbad \xff\xfe\t0\n", r"dev.tsv line 3: not UTF-8 text"),
        (b"sentence\tlabel\ngood\t1\nbad\t-1\n", r"dev.tsv line 3: label '-1' is not one of \['0', '1'\]"),
        (b"text\tlabel\ngood\t1\n", r"dev.tsv line 1: no column 'sentence'"),
    ],
)
def test_glue_bad_files_name_file_and_line(tmp_path: Path, dev: bytes, message: str) -> None:
    root = _sst(tmp_path, dev)
    with pytest.raises(DataFileError, match=message) as err:
        load_glue_file(root, "sst2", "dev.tsv", labelled=True)
    assert err.value.path == root / "SST-2" / "dev.tsv"


def test_glue_oversized_field_is_a_data_error(tmp_path: Path) -> None:
    root = _sst(tmp_path, b"sentence\tlabel\n" + b"x" * (1 << 24 | 1) + b"\t1\n")
    with pytest.raises(
        DataFileError, match=r"dev.tsv line \d: not a readable TSV \(field larger than field limit"
    ):
        read_tsv(root / "SST-2" / "dev.tsv", display="SST-2/dev.tsv")


def _imdb_copy(tmp_path: Path) -> Path:
    shutil.copytree(FIX / "aclImdb", tmp_path / "aclImdb")
    return tmp_path / "aclImdb"


def test_glue_imdb_reviews_bad_bytes_and_empty(tmp_path: Path) -> None:
    root = _imdb_copy(tmp_path)
    (root / "train" / "neg" / "5_1.txt").write_bytes(b"first line\nsecond \xc3\x28 line\n")
    with pytest.raises(DataFileError, match=r"train/neg/5_1.txt line 2: not UTF-8 text"):
        load_imdb_reviews(root, "train")
    (root / "train" / "neg" / "5_1.txt").write_bytes(b"<br /><br/>\n")
    with pytest.raises(DataFileError, match=r"train/neg/5_1.txt: empty review"):
        load_imdb_reviews(root, "train")
    for f in (root / "test" / "pos").iterdir():
        f.unlink()
    with pytest.raises(DataFileError, match=r"test/pos: holds no .txt reviews"):
        load_imdb_reviews(root, "test")


def test_corpus_reader_names_the_undecodable_line(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_bytes(b"one\r\ntwo\rthree\n\nfour\n\x80five\n")
    docs = iter_documents(path, doc_mode="blank")
    assert next(docs) == ["one", "two", "three"]  # \r\n and a lone \r end lines, as universal newlines do
    with pytest.raises(DataFileError, match=r"c.txt line 5: not UTF-8 text") as err:
        next(docs)
    assert err.value.line == 5


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_wordpiece(sorted((FIX / "corpus").glob("*.txt")), out, vocab_size=120)
    return out


def test_tokenizer_json_errors(tmp_path: Path, tok_file: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_bytes(tok_file.read_bytes()[:200])
    with pytest.raises(DataFileError, match=r"tokenizer.json: not a HF tokenizers tokenizer.json"):
        load_tokenizer(bad)
    spec = json.loads(tok_file.read_text())
    spec["model"]["vocab"] = {k: v for k, v in spec["model"]["vocab"].items() if k != "[MASK]"}
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "[MASK]"]
    bad.write_text(json.dumps(spec))
    with pytest.raises(DataFileError, match=r"tokenizer.json: the vocabulary has no mask token"):
        load_tokenizer(bad)


def test_token_cache_meta_is_validated(tmp_path: Path, tok_file: Path) -> None:
    corpus = build_token_cache(
        sorted((FIX / "corpus").glob("*.txt")), load_tokenizer(tok_file), tmp_path / "c"
    )
    assert corpus.num_documents > 0
    meta = tmp_path / "c" / "meta.json"
    good = meta.read_text()
    meta.write_text(good[:-20])
    with pytest.raises(DataFileError, match=r"meta.json line \d+: not JSON"):
        TokenizedCorpus(tmp_path / "c")
    meta.write_text(json.dumps({**json.loads(good), "dtype": "object"}))
    with pytest.raises(DataFileError, match=r"meta.json: not a token-cache meta.json"):
        TokenizedCorpus(tmp_path / "c")
    meta.write_text(json.dumps({**json.loads(good), "num_tokens": json.loads(good)["num_tokens"] + 1}))
    with pytest.raises(DataFileError, match=r"tokens.bin: expected \d+ uint16 tokens; delete the cache"):
        TokenizedCorpus(tmp_path / "c")
