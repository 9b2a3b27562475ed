"""The long-context experiments' layout (``--packing``): documents by default, the stream before packing kept
by name, one layout for every variant, and an experiment folder keeps the layout it started with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nystrom_lab.cli import build_parser
from nystrom_lab.long_context.experiment import LongContextRun, experiment_packing
from nystrom_lab.long_context.positions import PositionsRun


def arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_every_variant_gets_the_experiments_layout():
    run = LongContextRun(corpus=("c.txt",), out=Path("x"))
    assert run.packing == "documents"
    assert {arg(run.pretrain_args(v), "--packing") for v in run.variants} == {"documents"}
    stream = LongContextRun(corpus=("c.txt",), out=Path("x"), packing="stream")
    assert arg(stream.pretrain_args("window-512"), "--packing") == "stream"
    # long-positions: a variant's name says its layout (a plain name is a stream run, as every run before)
    assert arg(PositionsRun(corpus=("c.txt",)).pretrain_args("copy-nystrom"), "--packing") == "stream"
    with pytest.raises(ValueError, match="--packing must be one of"):
        LongContextRun(corpus=("c.txt",), packing="rows")


def test_records_without_packing_describe_stream_runs_and_read_back_unchanged(tmp_path):
    old = {"corpus": ["c.txt"], "out": str(tmp_path), "steps": 3}
    run = LongContextRun.from_record(old)
    assert run.packing == "stream" and "packing" not in run.record()  # written as before the option
    assert LongContextRun(corpus=("c.txt",), out=tmp_path).record()["packing"] == "documents"


def test_a_folder_keeps_its_layout(tmp_path):
    assert experiment_packing(None, tmp_path) == "documents"
    assert experiment_packing("stream", tmp_path) == "stream"
    (tmp_path / "settings.json").write_text(json.dumps({"corpus": ["c.txt"], "steps": 3}))  # before --packing
    assert experiment_packing(None, tmp_path) == "stream" == experiment_packing("stream", tmp_path)
    with pytest.raises(ValueError, match="holds a --packing stream experiment"):
        experiment_packing("documents", tmp_path)
    args = build_parser().parse_args(
        ["pretrain", "long-context", "--corpus", str(tmp_path), "--packing", "off"]
    )
    assert args.packing == "off"
