"""Property-based fuzzing of every file reader: random bytes, and truncations/mutations of valid files,
give a result or only the documented errors (DataFileError; FileNotFoundError for a file a manifest names),
in bounded memory (peak RSS checked per test). HYPOTHESIS_PROFILE=long runs 2000 examples per reader."""

from __future__ import annotations

import json
import pickle
import resource
import shutil
import struct
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nystrom_lab.data import DataFileError
from nystrom_lab.data.glue import load_glue_file, load_imdb_reviews
from nystrom_lab.data.lra.cifar import read_cifar_batch
from nystrom_lab.data.lra.listops import write_listops_tsv
from nystrom_lab.data.lra.loaders import load_aan, load_imdb, load_listops_file
from nystrom_lab.data.lra.pathfinder_io import load_pathfinder, read_metadata
from nystrom_lab.data.lra.png import read_png, write_png
from nystrom_lab.data.text import (
    TokenizedCorpus,
    build_token_cache,
    iter_documents,
    load_tokenizer,
    train_wordpiece,
)

FIX = Path(__file__).parents[2] / "fixtures" / "text"
RSS_GROWTH_LIMIT = 400 << 20  # bytes: far below what any declared size in these files could claim
SPECIAL = [
    b"\t",
    b"\n",
    b"\r\n",
    b"\r",
    b"\x00",
    b" ",
    b"..",
    b"/",
    b"\\",
    b"\xff",
    b"\xc3",
    b"-1",
    b"nan",
    b"9" * 30,
]


@pytest.fixture(autouse=True)
def _bounded_memory():
    """Peak RSS may not grow by more than RSS_GROWTH_LIMIT during one fuzz test (ru_maxrss: KiB on Linux)."""
    scale = 1 if sys.platform == "darwin" else 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    yield
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale - before
    assert grown < RSS_GROWTH_LIMIT, f"peak memory grew by {grown >> 20} MiB"


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` after 1-4 edits: truncation, byte overwrite, insertion (random or format-special bytes),
    deletion of a range, or duplication of a range."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["truncate", "overwrite", "insert", "special", "delete", "duplicate"]))
        pos = draw(st.integers(0, len(data)))
        if kind == "truncate":
            del data[pos:]
        elif kind == "overwrite" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "special":
            data[pos:pos] = draw(st.sampled_from(SPECIAL))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 64))]
        elif kind == "duplicate":
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 256))]
    return bytes(data)


def inputs(valid: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes or a mutation of ``valid`` (mostly the latter: it reaches deeper into a parser)."""
    return st.one_of(st.binary(max_size=512), mutated(valid), mutated(valid))


def only_documented(call: Callable[[], object], *, missing_ok: bool = False) -> object | None:
    """Run a reader: a result, or DataFileError (and FileNotFoundError when ``missing_ok``); else fail."""
    try:
        return call()
    except DataFileError as err:
        assert err.path is not None and str(err).startswith(str(err.path))
    except FileNotFoundError:
        if not missing_ok:
            raise
    return None


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# ---- LRA readers ----------------------------------------------------------------------------------------


def _valid_listops(work: Path) -> bytes:
    write_listops_tsv(
        work / "seed.tsv", [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [SM 5 ) ( ( [MIN 7 ) 3 ) ] ) ] )", 8)]
    )
    return (work / "seed.tsv").read_bytes()


@given(data=st.data())
def test_fuzz_listops_tsv(work: Path, data: st.DataObject) -> None:
    path = work / "basic_train.tsv"
    path.write_bytes(data.draw(inputs(_valid_listops(work))))
    ds = only_documented(lambda: load_listops_file(path, max_length=64))
    if ds is not None:
        assert len(ds) > 0 and all(int(ds[i][0][0]) != 0 for i in range(len(ds)))  # no empty example


@given(data=st.data())
def test_fuzz_aan_tsv(work: Path, data: st.DataObject) -> None:
    (work / "new_aan_pairs.train.tsv").write_bytes(
        data.draw(inputs(b"1\tP1\tP2\tfirst doc\tsecond doc\n0.0\tP3\tP4\tthird\tfourth\r\n"))
    )
    ds = only_documented(lambda: load_aan(work, split="train", max_length=16))
    if ds is not None:
        assert len(ds) > 0 and set(ds.labels.tolist()) <= {0, 1}


@given(reviews=st.lists(st.binary(max_size=64), min_size=1, max_size=3))
def test_fuzz_imdb_reviews(work: Path, reviews: list[bytes]) -> None:
    root = work / "aclImdb"
    shutil.rmtree(root, ignore_errors=True)
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            (root / split / label).mkdir(parents=True)
            for i, text in enumerate(reviews):
                (root / split / label / f"{i}_1.txt").write_bytes(text)
    only_documented(lambda: load_imdb(root, split="train", max_length=32))  # LRA: bytes
    only_documented(lambda: load_imdb_reviews(root, "test"))  # fine-tuning: UTF-8 text


def _py2_like_batch(n: int = 2) -> bytes:
    data = np.arange(n * 3072, dtype=np.int64).astype(np.uint8).reshape(n, 3072)
    raw = pickle.dumps({b"batch_label": b"b", b"labels": list(range(n)), b"data": data}, protocol=2)
    return raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")  # the official files' names


@given(data=st.data())
def test_fuzz_cifar_pickle(work: Path, data: st.DataObject) -> None:
    seed = data.draw(
        st.sampled_from([_py2_like_batch(), pickle.dumps({b"data": np.zeros((1, 3072), np.uint8)})])
    )
    path = work / "data_batch_1"
    path.write_bytes(data.draw(inputs(seed)))
    got = only_documented(lambda: read_cifar_batch(path))
    if got is not None:
        assert got[0].shape == (len(got[1]), 3072) and got[0].dtype == np.uint8 and got[1].max() <= 9


leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.binary(max_size=8), st.text(max_size=8))
objects = st.recursive(leaves, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(leaves.filter(
    lambda x: isinstance(x, (bytes, str, int))), c, max_size=4)), max_leaves=12)  # fmt: skip


@given(obj=objects, protocol=st.sampled_from([2, 4, 5]))
def test_fuzz_cifar_pickled_objects(work: Path, obj: object, protocol: int) -> None:
    path = work / "test_batch"
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    only_documented(lambda: read_cifar_batch(path))


def _chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


@st.composite
def png_files(draw: st.DrawFn) -> bytes:
    """Well-formed chunks (valid CRCs) with random header fields and random or truncated image data."""
    w, h = draw(st.integers(0, 40)), draw(st.integers(0, 40))
    depth, ctype = draw(st.sampled_from([1, 2, 4, 8, 16, 3])), draw(st.sampled_from([0, 2, 3, 4, 6, 7]))
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, draw(st.integers(0, 1)))
    raw = draw(st.binary(max_size=2 * (w + 1) * h + 8))
    idat = zlib.compress(raw)[: draw(st.integers(0, 1 << 16))]
    extra = _chunk(b"PLTE", b"\x00" * 6) if draw(st.booleans()) else b""
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + extra + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


@given(data=st.data(), expect=st.sampled_from([None, (8, 8)]))
def test_fuzz_png(work: Path, data: st.DataObject, expect: tuple[int, int] | None) -> None:
    write_png(work / "seed.png", np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8))
    path = work / "fuzz.png"
    path.write_bytes(data.draw(st.one_of(inputs((work / "seed.png").read_bytes()), png_files())))
    image = only_documented(lambda: read_png(path, shape=expect))
    if image is not None:
        assert image.dtype == np.uint8 and image.ndim == 2 and (expect is None or image.shape == expect)


def _pathfinder(work: Path) -> Path:
    root = work / "pf"
    if not root.is_dir():
        (root / "imgs" / "0").mkdir(parents=True)
        (root / "metadata").mkdir()
        for i in range(3):
            write_png(root / "imgs" / "0" / f"sample_{i}.png", np.full((32, 32), i, dtype=np.uint8))
    return root


@given(data=st.data())
def test_fuzz_pathfinder_metadata(work: Path, data: st.DataObject) -> None:
    root = _pathfinder(work)
    text = b"".join(b"imgs/0 sample_%d.png %d %d 1.0 14 4 2 0.5 1 1\n" % (i, i, i % 2) for i in range(3))
    np.save(work / "seed.npy", np.array([line.split(" ") for line in text.decode().splitlines()]))
    seed = data.draw(st.sampled_from([text, (work / "seed.npy").read_bytes()]))
    (root / "metadata" / "0.npy").write_bytes(data.draw(inputs(seed)))
    only_documented(lambda: read_metadata(root / "metadata" / "0.npy"))
    ds = only_documented(lambda: load_pathfinder(root, split="test", difficulty=None), missing_ok=True)
    if ds is not None:
        assert len(ds) > 0 and ds.pixels.shape[1] == 1024


# ---- text readers ---------------------------------------------------------------------------------------


@given(data=st.data())
def test_fuzz_glue_tsv(work: Path, data: st.DataObject) -> None:
    folder = work / "glue" / "MRPC"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dev.tsv").write_bytes(data.draw(inputs((FIX / "glue" / "MRPC" / "dev.tsv").read_bytes())))
    ex = only_documented(lambda: load_glue_file(work / "glue", "mrpc", "dev.tsv", labelled=True))
    if ex is not None:
        assert len(ex.text_a) == len(ex.labels) > 0 and set(ex.labels) <= {0, 1}


@given(data=st.data(), mode=st.sampled_from(["blank", "file"]))
def test_fuzz_corpus_reader(work: Path, data: st.DataObject, mode: str) -> None:
    path = work / "corpus.txt"
    path.write_bytes(data.draw(inputs((FIX / "corpus" / "science.txt").read_bytes()[:600])))
    docs = only_documented(lambda: list(iter_documents(path, doc_mode=mode)))
    if docs is not None:
        assert all(doc and all(seg and seg == seg.strip() for seg in doc) for doc in docs)


@pytest.fixture(scope="module")
def tok_json(work: Path) -> bytes:
    train_wordpiece(sorted((FIX / "corpus").glob("*.txt")), work / "seed_tok.json", vocab_size=120)
    return (work / "seed_tok.json").read_bytes()


@given(data=st.data())
def test_fuzz_tokenizer_json(work: Path, tok_json: bytes, data: st.DataObject) -> None:
    path = work / "tokenizer.json"
    path.write_bytes(data.draw(inputs(tok_json)))
    tok = only_documented(lambda: load_tokenizer(path))
    if tok is not None:
        assert min(tok.special_ids) >= 0 and tok.vocab_size > max(tok.special_ids)


@given(data=st.data())
def test_fuzz_token_cache_meta(work: Path, tok_json: bytes, data: st.DataObject) -> None:
    cache = work / "cache"
    if not cache.is_dir():
        (work / "tok_ok.json").write_bytes(tok_json)
        build_token_cache(sorted((FIX / "corpus").glob("*.txt")), load_tokenizer(work / "tok_ok.json"), cache)
        shutil.copy(cache / "meta.json", work / "meta.seed")
    valid = (work / "meta.seed").read_bytes()
    (cache / "meta.json").write_bytes(data.draw(inputs(valid)))
    corpus = only_documented(lambda: TokenizedCorpus(cache))
    if corpus is not None:
        assert json.loads(valid)["num_tokens"] == len(corpus.tokens)
