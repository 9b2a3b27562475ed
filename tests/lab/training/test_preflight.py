"""Empty splits and empty examples are refused before training starts (#15), naming the split.

They used to pass the loaders and fail late: a ZeroDivisionError at the first batch, a misleading
"metric not among the dev metrics []" at the first evaluation, a KeyError at the final test pass.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lab.training.toy_task import config, make_task
from nystrom_lab.data.lra.dataset import RaggedTokens, SequenceDataset
from nystrom_lab.training import train
from nystrom_lab.training.preflight import check_split


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_an_empty_split_is_refused_before_anything_is_written(split, tmp_path):
    task = dataclasses.replace(make_task(), **{split: []})
    with pytest.raises(ValueError, match=f"the {split} split is empty"):
        train(task, config(steps=4), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # before the lock, the record and the first step


def _tokens(lengths: list[int]) -> SequenceDataset:
    seqs = [np.arange(1, n + 1, dtype=np.uint16) for n in lengths]
    return SequenceDataset(RaggedTokens(seqs), np.zeros(len(seqs)), max_length=8, source="dev.tsv")


def test_an_empty_example_is_refused_naming_split_source_and_index(tmp_path):
    task = dataclasses.replace(make_task(), dev=_tokens([3, 2, 0, 4, 0]))
    with pytest.raises(ValueError, match=r"the dev split \(dev\.tsv\) holds 2 empty example\(s\).*index 2"):
        train(task, config(steps=4), tmp_path, progress=False)
    check_split("dev", _tokens([3, 1]))  # no empty one: accepted


def test_lra_checks_its_test_split_before_training(tmp_path, monkeypatch):
    """run_lra evaluates the test split itself, after the loop: it is checked up front too."""
    from nystrom_lab.lra import experiment as lra

    real = lra.load_splits

    def no_test(run, out):
        return {**real(run, out), "test": _tokens([])}

    monkeypatch.setattr(lra, "load_splits", no_test)
    run = lra.LRARun(task="listops", preset="quick", listops_sizes=(12, 4, 4), steps=2, out=tmp_path)
    with pytest.raises(ValueError, match=r"the test split \(dev\.tsv\) is empty"):
        lra.run_lra(run, progress=False)
    assert not (tmp_path / "last").exists() and not (tmp_path / "metrics.jsonl").exists()
