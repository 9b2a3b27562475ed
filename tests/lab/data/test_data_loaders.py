"""Loaders for IMDB, AAN and CIFAR-10 on tiny fixtures in the real formats, plus the CLI hook."""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from nystrom_lab.data import DataFileError
from nystrom_lab.data.lra.cifar import cifar_to_grey, load_cifar10, read_cifar_batch
from nystrom_lab.data.lra.commands import register
from nystrom_lab.data.lra.listops import read_listops_tsv
from nystrom_lab.data.lra.listops_eval import evaluate_listops
from nystrom_lab.data.lra.loaders import load_aan, load_imdb
from nystrom_lab.data.lra.pathfinder_io import read_metadata
from nystrom_lab.data.lra.tokenize import decode_bytes, encode_bytes


def _imdb(root: Path) -> Path:
    base = root / "aclImdb"
    texts = {
        ("train", "neg"): {"0_3.txt": b"Bad.", "10_1.txt": b"Awful \xe2\x80\x94 truly."},
        ("train", "pos"): {"2_9.txt": b"Great film!"},
        ("test", "neg"): {"1_2.txt": b"Meh"},
        ("test", "pos"): {"5_10.txt": b"Loved it"},
    }
    for (split, label), files in texts.items():
        (base / split / label).mkdir(parents=True)
        for name, data in files.items():
            (base / split / label / name).write_bytes(data)
    return base


def test_imdb_bytes_plus_one(tmp_path: Path) -> None:
    base = _imdb(tmp_path)
    ds = load_imdb(base, split="train", max_length=12)
    assert len(ds) == 3 and ds.labels.tolist() == [0, 0, 1]
    x, y = ds[1]  # 10_1.txt sorts after 0_3.txt numerically
    raw = b"Awful \xe2\x80\x94 truly."[:12]
    assert x.dtype == torch.int64 and x.shape == (12,) and int(y) == 0
    assert x.tolist() == [b + 1 for b in raw]
    x0, _ = ds[0]
    assert x0.tolist() == [ord(c) + 1 for c in "Bad."] + [0] * 8
    assert decode_bytes(x0.numpy()) == b"Bad."
    dev = load_imdb(base, split="dev", max_length=8)
    assert dev.labels.tolist() == [0, 1] and dev[1][0].tolist() == [ord(c) + 1 for c in "Loved it"]


def test_imdb_missing_and_empty_folders(tmp_path: Path) -> None:
    base = _imdb(tmp_path)
    with pytest.raises(FileNotFoundError, match="IMDB folder not found: .*nope"):
        load_imdb(tmp_path / "nope", split="train")
    for f in (base / "test" / "pos").iterdir():
        f.unlink()
    with pytest.raises(DataFileError, match=r"test/pos: holds no .txt reviews \(an empty split\)"):
        load_imdb(base, split="test")


@pytest.mark.parametrize("content", [b"", b" \n\t "])
def test_imdb_empty_review_names_the_file(tmp_path: Path, content: bytes) -> None:
    base = _imdb(tmp_path)
    (base / "train" / "pos" / "7_8.txt").write_bytes(content)
    with pytest.raises(DataFileError, match=r"train/pos/7_8.txt: empty review") as err:
        load_imdb(base, split="train")
    assert err.value.path == base / "train" / "pos" / "7_8.txt" and err.value.line is None


def _aan(root: Path, lines: list[bytes], split: str = "train") -> None:
    (root / f"new_aan_pairs.{split}.tsv").write_bytes(b"\n".join(lines) + b"\n")


def test_aan_pairs(tmp_path: Path) -> None:
    _aan(tmp_path, [b"1.0\tP1\tP2\tfirst doc\tsecond", b'0\tP3\tP4\t"quoted"\tx\r'], "eval")
    ds = load_aan(tmp_path, split="dev", max_length=6)
    assert len(ds) == 2 and ds.labels.tolist() == [1, 0]
    a, b, y = ds[0]
    assert a.tolist() == [c + 1 for c in b"first "] and b.tolist() == [c + 1 for c in b"second"]
    assert a.dtype == b.dtype == y.dtype == torch.int64 and int(y) == 1
    a, b, _ = ds[1]
    assert a.tolist() == [c + 1 for c in b'"quote'] and b.tolist() == [ord("x") + 1, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"1\tP1\tP2\tonly four", "new_aan_pairs.train.tsv line 2: expected 5 tab-separated fields, got 4"),
        (b"yes\tP1\tP2\ta\tb", "new_aan_pairs.train.tsv line 2: label must be 0 or 1, got 'yes'"),
        (b"2\tP1\tP2\ta\tb", "new_aan_pairs.train.tsv line 2: label must be 0 or 1"),
        (b"nan\tP1\tP2\ta\tb", "new_aan_pairs.train.tsv line 2: label must be 0 or 1"),
        (b"1\tP1\tP2\t\tb", "new_aan_pairs.train.tsv line 2: empty example: text field 4 is blank"),
        (b"1\tP1\tP2\ta\t  ", "new_aan_pairs.train.tsv line 2: empty example: text field 5 is blank"),
        (b"", "new_aan_pairs.train.tsv line 2: expected 5 tab-separated fields, got 1"),
    ],
)
def test_aan_malformed_lines(tmp_path: Path, line: bytes, message: str) -> None:
    _aan(tmp_path, [b"0\tA\tB\tx\ty", line])
    with pytest.raises(DataFileError, match=message) as err:
        load_aan(tmp_path, split="train")
    assert err.value.line == 2 and err.value.path.name == "new_aan_pairs.train.tsv"
    with pytest.raises(FileNotFoundError, match="new_aan_pairs.test.tsv"):
        load_aan(tmp_path, split="test")


def test_aan_empty_file(tmp_path: Path) -> None:
    (tmp_path / "new_aan_pairs.train.tsv").write_bytes(b"")
    with pytest.raises(DataFileError, match="new_aan_pairs.train.tsv line 1: empty file"):
        load_aan(tmp_path, split="train")


def _cifar(root: Path, n: int = 4) -> Path:
    base = root / "cifar-10-batches-py"
    base.mkdir()
    rng = np.random.default_rng(0)
    for i, name in enumerate([*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [(i + j) % 10 for j in range(n)]
        with open(base / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": name.encode()}, f)
    return base


def test_cifar_grey_formula() -> None:
    pixels = [(255, 255, 255), (255, 0, 0), (0, 255, 0), (0, 0, 255), (10, 20, 30), (0, 0, 0)]
    data = np.zeros((len(pixels), 3072), dtype=np.uint8)
    for i, (r, g, b) in enumerate(pixels):
        data[i, 0], data[i, 1024], data[i, 2048] = r, g, b
    # tf.image.rgb_to_grayscale on uint8: floor((0.2989 R + 0.587 G + 0.114 B) / 255 * 255.5)
    assert cifar_to_grey(data)[:, 0].tolist() == [255, 76, 149, 29, 18, 0]


def test_cifar_splits(tmp_path: Path) -> None:
    base = _cifar(tmp_path)
    train = load_cifar10(base, split="train", train_size=18)
    dev = load_cifar10(base, split="dev", train_size=18)
    test = load_cifar10(base, split="test")
    assert (len(train), len(dev), len(test)) == (18, 2, 4)
    x, y = dev[1]
    with open(base / "data_batch_5", "rb") as f:
        last = pickle.load(f, encoding="bytes")
    assert x.shape == (1024,) and x.dtype == torch.int64 and int(y) == last[b"labels"][3]
    assert torch.equal(x, torch.from_numpy(cifar_to_grey(last[b"data"][3:4])[0].astype(np.int64)))
    inputs, labels = test.tensors()
    assert inputs.shape == (4, 1024) and labels.tolist() == [5, 6, 7, 8]


def test_cifar_errors_name_the_file(tmp_path: Path) -> None:
    base = _cifar(tmp_path)
    (base / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_cifar10(base, split="train", train_size=10)
    (base / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataFileError, match="test_batch: not a CIFAR-10 python pickle"):
        load_cifar10(base, split="test")
    cases = [
        (
            {b"data": np.zeros((2, 10), dtype=np.uint8), b"labels": [0, 1]},
            r"expected b'data' as an \(N, 3072\)",
        ),
        ({b"data": np.zeros((2, 3072), dtype=np.int16), b"labels": [0, 1]}, r"\(N, 3072\) uint8 array, got"),
        ({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0, 10]}, "list of ints in 0..9"),
        ({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0, True]}, "list of ints in 0..9"),
        ({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0]}, "2 images but 1 labels"),
        ({b"data": np.zeros((0, 3072), dtype=np.uint8), b"labels": []}, "the batch holds no images"),
        ([1, 2], "expected a dict with keys b'data' and b'labels'"),
    ]
    for batch, message in cases:
        with open(base / "test_batch", "wb") as f:
            pickle.dump(batch, f)
        with pytest.raises(DataFileError, match=message) as err:
            load_cifar10(base, split="test")
        assert err.value.path == base / "test_batch"


class _Payload:
    """Unpickling this creates ``target``: the attack a crafted data_batch_1 could carry."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return os.system, (f"touch {self.target}",)


def test_cifar_pickle_cannot_run_code(tmp_path: Path) -> None:
    base = _cifar(tmp_path)
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(_Payload(proof)))  # the payload is live under a plain unpickler
    assert proof.exists()
    target = tmp_path / "pwned"
    batch = {b"data": np.zeros((4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 3], b"x": _Payload(target)}
    for protocol in (2, 4, 5):
        (base / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=protocol))
        with pytest.raises(
            DataFileError, match=r"data_batch_1: refused to load: the pickle names posix.system"
        ):
            load_cifar10(base, split="train", train_size=10)
        assert not target.exists()
    encoded = pickle.dumps(b"\x00", protocol=2).replace(b"latin1", b"zlib__")  # _codecs.encode, other codec
    (base / "test_batch").write_bytes(encoded)
    with pytest.raises(DataFileError, match="_codecs.encode is admitted only as"):
        load_cifar10(base, split="test")


def _py2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A batch pickled as the official files are (Python 2 cPickle, protocol 2, numpy 1.x names):
    ``str`` as (SHORT_)BINSTRING, the array as ``numpy.core.multiarray._reconstruct`` + BUILD state."""

    def s(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b

    def i(v: int) -> bytes:
        return b"K" + bytes([v]) if 0 <= v < 256 else b"M" + struct.pack("<H", v)

    dtype = b"cnumpy\ndtype\n" + s(b"u1") + i(0) + i(1) + b"\x87R(" + i(3) + s(b"|") + b"NNN"
    dtype += b"J\xff\xff\xff\xffJ\xff\xff\xff\xff" + i(0) + b"tb"
    array = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + i(0) + b"\x85" + s(b"b") + b"\x87R"
    array += (
        b"("
        + i(1)
        + i(data.shape[0])
        + i(data.shape[1])
        + b"\x86"
        + dtype
        + b"\x89"
        + s(data.tobytes())
        + b"tb"
    )
    out = b"\x80\x02}(" + s(b"batch_label") + s(b"testing batch 1 of 1") + s(b"labels") + b"]("
    return out + b"".join(i(y) for y in labels) + b"e" + s(b"data") + array + b"u."


@pytest.mark.parametrize("protocol", ["py2", 2, 4, 5])
def test_cifar_reads_genuine_numpy_pickles(tmp_path: Path, protocol: int | str) -> None:
    data = np.random.default_rng(1).integers(0, 256, size=(3, 3072), dtype=np.uint8)
    path = tmp_path / "test_batch"
    if protocol == "py2":
        path.write_bytes(_py2_batch(data, [9, 0, 4]))
    else:
        batch = {b"batch_label": b"testing batch 1 of 1", b"labels": [9, 0, 4], b"data": data}
        batch[b"filenames"] = [b"a.png", b"b.png", b"c.png"]
        path.write_bytes(pickle.dumps(batch, protocol=protocol))
    got, labels = read_cifar_batch(path)
    assert np.array_equal(got, data) and labels.tolist() == [9, 0, 4] and labels.dtype == np.int64


def test_cifar_declared_sizes_allocate_nothing(tmp_path: Path) -> None:
    """Found by the fuzz tests: a length or memo index a file merely declares must not be allocated (the C
    unpickler grew its memo table to a mutated LONG_BINPUT index: 2.7 GB from a 452-byte file)."""
    path = tmp_path / "test_batch"
    path.write_bytes(b"\x80\x04\x8e" + struct.pack("<Q", 1 << 60) + b"abc")  # BINBYTES8 of 2**60 bytes
    with pytest.raises(DataFileError, match="test_batch: not a CIFAR-10 python pickle"):
        read_cifar_batch(path)
    path.write_bytes(b"\x80\x02]r" + struct.pack("<I", 175_726_962) + b".")  # LONG_BINPUT 175726962
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(
        DataFileError, match=r"test_batch: not a CIFAR-10 python pickle \(memo index 175726962"
    ):
        read_cifar_batch(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB


class _Reduced:
    """Pickles as ``func(*args)`` then BUILD ``state``: numpy's own layout, with any values we like."""

    def __init__(self, func: object, args: tuple, state: object) -> None:
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return self.func, self.args, self.state


DEFAULT_DTYPE_STATE = (3, "|", None, None, None, -1, -1, 0)


@pytest.mark.parametrize(
    ("code", "dtype_state", "message"),
    [
        ("u1", DEFAULT_DTYPE_STATE, None),  # the control: numpy's layout, rebuilt by hand, loads
        # numpy's dtype.__setstate__ would set these flags (NPY_ITEM_REFCOUNT, ...) on uint8: internal errors
        ("u1", (3, "|", None, None, None, -1, -1, 0x3F), "dtype state is not that of a plain integer dtype"),
        ("u1", (3, "|", None, ("a",), None, -1, -1, 0), "dtype state is not that of a plain integer dtype"),
        ("O8", DEFAULT_DTYPE_STATE, "'O8' is not a plain integer dtype"),
        ("f4", DEFAULT_DTYPE_STATE, "'f4' is not a plain integer dtype"),
    ],
)
def test_cifar_numpy_states_are_checked(
    tmp_path: Path, code: str, dtype_state: tuple, message: str | None
) -> None:
    from numpy._core.multiarray import _reconstruct

    dtype = _Reduced(np.dtype, (code, False, True), dtype_state)
    array = _Reduced(_reconstruct, (np.ndarray, (0,), b"b"), (1, (1, 3072), dtype, False, bytes(3072)))
    path = tmp_path / "test_batch"
    path.write_bytes(pickle.dumps({b"data": array, b"labels": [1]}, protocol=2))
    if message is None:
        data, labels = read_cifar_batch(path)
        assert data.shape == (1, 3072) and not data.any() and labels.tolist() == [1]
    else:
        with pytest.raises(DataFileError, match=message):
            read_cifar_batch(path)


def test_encode_bytes_round_trip() -> None:
    ids = encode_bytes("héllo".encode(), max_length=100)
    assert ids.min() >= 1 and decode_bytes(ids) == "héllo".encode()


def _cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nystrom")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_listops_and_pathfinder(tmp_path: Path) -> None:
    args = _cli().parse_args(
        ["data", "listops", str(tmp_path / "lo"), "--train", "3", "--dev", "1", "--test", "1"]
    )
    assert args.func(args) == 0
    rows = read_listops_tsv(tmp_path / "lo" / "basic_train.tsv")
    assert len(rows) == 3 and all(evaluate_listops(s) == y for s, y in rows)
    args = _cli().parse_args(
        ["data", "pathfinder", str(tmp_path / "pf"), "--difficulty", "6", "--count", "4"]
    )
    assert args.func(args) == 0
    assert len(read_metadata(tmp_path / "pf" / "curv_baseline" / "metadata" / "0.npy")) == 4
    with pytest.raises(SystemExit):
        _cli().parse_args(["data", "pathfinder", str(tmp_path), "--difficulty", "7"])
