"""Text corpora: tokenizer loading, the token cache, SOP instances, MLM masking statistics, determinism."""

import random
from pathlib import Path

import numpy as np
import pytest

from nystrom.model import minilm_path
from nystrom_lab.data.text import build_token_cache, load_tokenizer
from nystrom_lab.data.text_pretrain import (
    PretrainingDataset,
    build_instances,
    mask_tokens,
    split_documents,
)

CORPUS = Path(__file__).parents[2] / "fixtures" / "text" / "corpus"
FILES = sorted(CORPUS.glob("*.txt"))


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory, tok):
    """400 documents of 6 fixture sentences each (shuffled, deterministic), tokenised."""
    lines = [ln for f in FILES for ln in f.read_text().splitlines() if ln]
    rnd = random.Random(0)
    docs = ["\n".join(rnd.sample(lines, 6)) for _ in range(400)]
    path = tmp_path_factory.mktemp("big") / "big.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return build_token_cache([path], tok, path.parent / "cache")


def test_minilm_tokenizer_has_no_padding_or_truncation():
    tok = load_tokenizer(minilm_path())
    ids = tok.encode(["word " * 300])[0]
    assert len(ids) == 300 and tok.pad_id not in ids  # the shipped file truncates/pads to 128
    assert (tok.cls_id, tok.sep_id, tok.mask_id, tok.pad_id) == (101, 102, 103, 0)


def test_token_cache_matches_the_tokenizer_and_is_reused(tmp_path, tok):
    cache = build_token_cache(FILES, tok, tmp_path / "c")
    assert cache.num_documents == 14  # 8 + 6 blank-line separated documents
    first = FILES[0].read_text().splitlines()[0]
    seg = cache.document_segments(0)
    assert list(cache.tokens[seg[0] : seg[1]]) == tok.encode([first])[0]
    assert len(cache.tokens) == sum(
        len(ids) for f in FILES for ids in tok.encode([x for x in f.read_text().splitlines() if x])
    )
    again = build_token_cache(FILES, tok, tmp_path / "c")
    assert np.array_equal(again.documents, cache.documents)
    with pytest.raises(ValueError, match="other files/tokenizer/doc_mode"):
        build_token_cache(FILES, tok, tmp_path / "c", doc_mode="file")
    assert build_token_cache(FILES, tok, tmp_path / "f", doc_mode="file").num_documents == 2


def test_split_documents_is_disjoint_and_covers():
    s = split_documents(100, 0.05)
    assert len(s["dev"]) == 5 and len(s["train"]) == 95
    assert sorted(np.concatenate([s["train"], s["dev"]]).tolist()) == list(range(100))


class _Stub:
    """One document of 20000 five-token segments."""

    def document_segments(self, d):
        return np.arange(0, 100_001, 5)


def test_short_sequence_probability_and_instance_bounds():
    inst = build_instances(_Stub(), np.array([0]), seq_len=64, short_seq_prob=0.1, seed=3)
    start, split, end = inst.T
    assert (start < split).all() and (split < end).all() and (start[1:] == end[:-1]).all()
    multi = end - start > 5  # chunks of >= 2 segments split at a segment boundary, others inside it
    assert ((split - start)[multi] % 5 == 0).all() and ((end - split)[multi] % 5 == 0).all()
    short = ((end - start)[:-1] < 61).mean()  # a full chunk reaches L - 3 = 61 tokens
    # P(target <= 56) = 0.1 * 55/60 for a uniform target in [2, 61]
    assert short == pytest.approx(0.1 * 55 / 60, abs=0.025)
    none = build_instances(_Stub(), np.array([0]), seq_len=64, short_seq_prob=0.0, seed=3)
    assert ((none[:, 2] - none[:, 0])[:-1] >= 61).all()


def test_masking_statistics():
    rng = np.random.default_rng(0)
    ids = np.arange(10, 210)  # 200 ordinary tokens
    cands = np.arange(200)
    repl = np.arange(5, 1000)
    counts = np.zeros(3)
    for _ in range(1000):
        out, labels = mask_tokens(ids, cands, rng, mask_id=3, replacement_ids=repl)
        pos = labels != -100
        assert pos.sum() == 30 and (labels[pos] == ids[pos]).all() and (out[~pos] == ids[~pos]).all()
        counts += [
            (out[pos] == 3).sum(),
            ((out[pos] != 3) & (out[pos] != ids[pos])).sum(),
            (out[pos] == ids[pos]).sum(),
        ]
    frac = counts / counts.sum()
    assert frac == pytest.approx([0.8, 0.1, 0.1], abs=0.01)  # 30000 predictions: std ≈ 0.002


def test_dataset_items_specials_sop_and_determinism(big_corpus, tok):
    ds = PretrainingDataset(big_corpus, tok, split="train", seq_len=32, seed=7)
    assert len(ds) > 500
    special = set(tok.special_ids)
    swapped, masked, cands = 0, 0, 0
    for i in range(len(ds)):
        it = ds[i]
        ids, types, labels = it["input_ids"].numpy(), it["token_type_ids"].numpy(), it["labels"].numpy()
        assert len(ids) <= 32 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id
        orig = np.where(labels != -100, labels, ids)
        sep = int(np.flatnonzero(orig == tok.sep_id)[0])
        assert (types[: sep + 1] == 0).all() and (types[sep + 1 :] == 1).all()
        for p in (0, sep, len(ids) - 1):
            assert labels[p] == -100  # special tokens are never predicted
        assert not special & set(labels[labels != -100].tolist())
        n_c = len(ids) - 3
        assert (labels != -100).sum() == max(1, round(0.15 * n_c))
        masked, cands = masked + (labels != -100).sum(), cands + n_c
        # SOP: A/B come from [start, split) and [split, end), in swapped order when the label is 1
        start, split, end = ds.instances[i]
        first, second = orig[1:sep], orig[sep + 1 : -1]
        lab = int(it["sentence_order_label"])
        swapped += lab
        a_src, b_src = big_corpus.tokens[start:split].tolist(), big_corpus.tokens[split:end].tolist()
        if lab:
            first, second = second, first
        assert _is_sub(first.tolist(), a_src) and _is_sub(second.tolist(), b_src)
    assert swapped / len(ds) == pytest.approx(0.5, abs=0.06)
    assert masked / cands == pytest.approx(0.15, abs=0.015)  # per-example rounding of 0.15·(n - 3)
    again = PretrainingDataset(big_corpus, tok, split="train", seq_len=32, seed=7)
    other = PretrainingDataset(big_corpus, tok, split="train", seq_len=32, seed=8)
    for i in (0, 5, len(ds) - 1):
        assert all((ds[i][k] == again[i][k]).all() for k in ds[i])
    assert any(not (ds[i]["input_ids"] == other[i]["input_ids"]).all() for i in range(20) if len(other) > i)


def _is_sub(part: list, whole: list) -> bool:
    n = len(part)
    return any(whole[k : k + n] == part for k in range(len(whole) - n + 1))


def test_dupe_factor_redraws_masks_and_order_per_copy(big_corpus, tok):
    """Copy c of pair j is item c·I + j: the same pair (regression: one fixed draw per pair let
    Figure 5's models memorise masks and SOP labels), copy 0 unchanged."""
    one = PretrainingDataset(big_corpus, tok, split="train", seq_len=32, seed=7)
    three = PretrainingDataset(big_corpus, tok, split="train", seq_len=32, seed=7, dupe_factor=3)
    n = len(one)
    assert len(three) == 3 * n and len(three.instances) == n
    for j in (0, 7, n - 1):
        assert all((one[j][k] == three[j][k]).all() for k in one[j])
    differ, flips = 0, 0
    for j in range(100):
        a, b = three[j], three[n + j]
        flips += int(a["sentence_order_label"] != b["sentence_order_label"])
        differ += int(not np.array_equal(a["labels"].numpy(), b["labels"].numpy()))
    assert differ >= 95 and 30 <= flips <= 70  # fresh masks; SOP order redrawn (≈ half flip)
    with pytest.raises(IndexError):
        three[3 * n]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="dupe_factor"):
            PretrainingDataset(big_corpus, tok, split="train", seq_len=32, dupe_factor=bad)
