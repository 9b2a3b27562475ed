"""ListOps generator, TSV round trip, tokenizer and the independent evaluator."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from nystrom_lab.data import DataFileError
from nystrom_lab.data.lra.listops import (
    OPERATORS,
    ListOpsConfig,
    apply_operator,
    generate_listops,
    read_listops_tsv,
    sample_tree,
    write_listops_tsv,
)
from nystrom_lab.data.lra.listops_eval import evaluate_listops
from nystrom_lab.data.lra.loaders import load_listops, load_listops_file
from nystrom_lab.data.lra.tokenize import (
    LISTOPS_VOCAB,
    LISTOPS_VOCAB_SIZE,
    decode_listops,
    encode_listops,
    listops_symbols,
)

SIZES = {"train": 40, "dev": 6, "test": 6}


def _structure(source: str) -> tuple[int, int, int, int]:
    """(length, max operator nesting, min args, max args) parsed from the string."""
    length, stack, depth, arg_counts = 0, [], 0, []
    for tok in listops_symbols(source):
        length += 1
        if tok.startswith("["):
            if stack:
                stack[-1] += 1
            stack.append(0)
            depth = max(depth, len(stack))
        elif tok == "]":
            arg_counts.append(stack.pop())
        else:
            stack[-1] += 1
    return length, depth, min(arg_counts), max(arg_counts)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("listops")
    return generate_listops(out, **SIZES, seed=7, workers=1, chunk_size=20)


def test_release_file_names_and_split_sizes(generated: dict[str, Path]) -> None:
    assert {p.name for p in generated.values()} == {"basic_train.tsv", "basic_val.tsv", "basic_test.tsv"}
    for split, size in SIZES.items():
        assert len(read_listops_tsv(generated[split])) == size


def test_every_label_matches_the_independent_evaluator(generated: dict[str, Path]) -> None:
    rows = [row for p in generated.values() for row in read_listops_tsv(p)]
    assert len(rows) == sum(SIZES.values())
    for source, label in rows:
        assert evaluate_listops(source) == label


def test_lengths_depth_arity_and_dedup(generated: dict[str, Path]) -> None:
    sources = [s for p in generated.values() for s, _ in read_listops_tsv(p)]
    assert len(set(sources)) == len(sources)  # no duplicate, also none across splits
    for source in sources:
        length, depth, lo, hi = _structure(source)
        assert 500 < length < 2000
        assert depth <= 9  # operators only above max depth 10
        assert 2 <= lo and hi <= 10


def test_lines_are_written_like_csv_writer(generated: dict[str, Path]) -> None:
    raw = generated["dev"].read_bytes()
    assert raw.startswith(b"Source\tTarget\r\n")
    assert raw.count(b"\r\n") == SIZES["dev"] + 1
    first = raw.split(b"\r\n")[1].decode()
    assert first.startswith("( ") and first.split("\t")[0].endswith(" ] )")


def test_same_seed_same_files_any_worker_count(tmp_path: Path, generated: dict[str, Path]) -> None:
    again = generate_listops(tmp_path / "w2", **SIZES, seed=7, workers=2, chunk_size=20)
    for split in SIZES:
        assert again[split].read_bytes() == generated[split].read_bytes()
    other = generate_listops(tmp_path / "s8", train=5, dev=0, test=0, seed=8, chunk_size=20)
    assert read_listops_tsv(other["train"]) != read_listops_tsv(generated["train"])[:5]


def test_published_string_format_from_a_scripted_draw() -> None:
    class Scripted(random.Random):
        def __init__(self, values: list[float]) -> None:
            super().__init__(0)
            self.values = values

        def random(self) -> float:
            return self.values.pop(0)

    # operator (0.1 <= 0.25), 2 args (0.0), [MAX (0.3 * 4 -> 1), leaf 2, leaf 9
    rng = Scripted([0.1, 0.0, 0.3, 0.9, 0.25, 0.9, 0.95])
    tree = sample_tree(rng, ListOpsConfig())
    assert tree == ("( ( ( [MAX 2 ) 9 ) ] )", 9, 4)


def test_label_distribution_is_spread() -> None:
    rng = random.Random(3)
    cfg = ListOpsConfig(min_length=20, max_length=400)
    values = []
    while len(values) < 300:
        tree = sample_tree(rng, cfg)
        if tree is not None and cfg.min_length < tree[2] < cfg.max_length:
            assert evaluate_listops(tree[0]) == tree[1]
            values.append(tree[1])
    counts = np.bincount(values, minlength=10)
    assert counts.max() / 300 < 0.35 and (counts > 0).sum() >= 8


def test_operators_and_median_rule() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        args = rng.integers(0, 10, size=int(rng.integers(2, 11))).tolist()
        assert apply_operator("[MED", args) == int(np.median(args))
        assert apply_operator("[SM", args) == sum(args) % 10
    assert apply_operator("[MED", [3, 4]) == 3 and apply_operator("[MED", [1, 2, 9]) == 2
    assert evaluate_listops("( ( ( [MIN 3 ) ( ( ( [MAX 1 ) 9 ) ] ) ) ] )") == 3
    assert evaluate_listops("[SM 5 7 [MED 1 2 3 4 ] ]") == 4
    assert set(OPERATORS) == {"[MIN", "[MAX", "[MED", "[SM"}


@pytest.mark.parametrize("bad", ["[MAX 1 2", "[MAX ]", "] 3", "[MAX 1 ] 2", "[FIRST 1 ]", "[MAX 12 ]"])
def test_evaluator_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        evaluate_listops(bad)


def test_tsv_round_trip(tmp_path: Path) -> None:
    rows = [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [SM 5 ) 7 ) ] )", 2)]
    path = tmp_path / "basic_test.tsv"
    write_listops_tsv(path, rows)
    assert read_listops_tsv(path) == rows


def test_tokenizer() -> None:
    assert LISTOPS_VOCAB_SIZE == 16 and LISTOPS_VOCAB[0] == "<pad>"
    ids = encode_listops("( ( ( [MAX 2 ) 9 ) ] )", max_length=10)
    assert ids.tolist() == [2, 8, 15, 5]
    assert decode_listops(ids) == "[MAX 2 9 ]"
    assert encode_listops("( ( ( [MAX 2 ) 9 ) ] )", max_length=2).tolist() == [2, 8]
    with pytest.raises(ValueError, match="f.tsv line 3: unknown ListOps symbol '12'"):
        encode_listops("( [MAX 12 ] )", max_length=10, where="f.tsv line 3")


def test_loader_pads_and_truncates(tmp_path: Path) -> None:
    write_listops_tsv(tmp_path / "basic_val.tsv", [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( [MIN 4 ) ] )", 4)])
    ds = load_listops(tmp_path, split="dev", max_length=6)
    x, y = ds[0]
    assert x.dtype == torch.int64 and y.dtype == torch.int64
    assert x.tolist() == [2, 8, 15, 5, 0, 0] and int(y) == 9
    inputs, labels = ds.tensors()
    assert inputs.shape == (2, 6) and labels.tolist() == [9, 4]
    short = load_listops(tmp_path, split="dev", max_length=3)
    assert short[0][0].tolist() == [2, 8, 15]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("Src\tTarget\r\n", "basic_train.tsv line 1: expected the header"),
        (
            "Source\tTarget\r\n[MAX 1 ]\t1\r\n[MAX 2 ]\r\n",
            "basic_train.tsv line 3: expected 2 tab-separated fields, got 1",
        ),
        ("Source\tTarget\n[MAX 1 ]\t1\n[MAX 2 ]\tx\n", "basic_train.tsv line 3: Target must be a digit"),
        ("", "basic_train.tsv line 1: empty file"),
    ],
)
def test_malformed_tsv_names_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "basic_train.tsv"
    path.write_bytes(content.encode())
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        read_listops_tsv(path)


def test_unknown_symbol_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "basic_train.tsv"
    path.write_text("Source\tTarget\n[MAX 1 ]\t1\n[MAX 1 x ]\t1\n")
    with pytest.raises(DataFileError, match="basic_train.tsv line 3: unknown ListOps symbol 'x'"):
        load_listops_file(path)
    with pytest.raises(FileNotFoundError, match="basic_test.tsv"):
        load_listops(tmp_path, split="test")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"Source\tTarget\r\n", r"basic_train.tsv: no examples after the header \(an empty split\)"),
        (b"Source\tTarget\n[MAX 1 ]\t1\n( ( ) )\t1\n", "basic_train.tsv line 3: empty example"),
        (b"Source\tTarget\n\t1\n", "basic_train.tsv line 2: empty example"),
        (b"Source\tTarget\n[MAX 1 ]\t1\n[MAX \xff ]\t1\n", "basic_train.tsv line 3: not UTF-8 text"),
        (b"\xef\xbb\xbfSource\tTarget\n", "basic_train.tsv line 1: expected the header"),
    ],
)
def test_empty_split_empty_example_and_bad_bytes(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "basic_train.tsv"
    path.write_bytes(content)
    with pytest.raises(DataFileError, match=message) as err:
        load_listops_file(path)
    assert err.value.path == path
