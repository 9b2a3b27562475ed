"""``python -m nystrom_lab.bench.packing`` at toy size: the same real tokens under every layout, the padding
shares of the length mix, timed steps for every layout, and the table (packed timing needs the models'
packed-document keywords)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nystrom_lab.bench.packing.__main__ import main
from nystrom_lab.data.text import train_wordpiece

CORPUS = Path(__file__).parents[2] / "fixtures" / "text" / "corpus"


def test_packed_padded_and_stream_rows_of_the_same_documents(tmp_path, capsys):
    files = sorted(CORPUS.glob("*.txt"))
    tok = train_wordpiece(files, tmp_path / "tokenizer.json", vocab_size=300)  # MiniLM's 30522 ids: slower
    argv = ["--corpus", *map(str, files), "--tokenizer", str(tok.path), "--max-length", "64",
            "--layouts", "padded", "packed", "stream", "--tokens-per-step", "128", "--rounds", "1", "--warmup", "0",
            "--hidden", "16", "--layers", "1", "--heads", "2", "--ffn", "32", "--out", str(tmp_path / "out"),
            "--cache", str(tmp_path / "cache"), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    res = json.loads((tmp_path / "out" / "bench_packing.json").read_text())
    assert res["machine"]["torch"] and res["command"].startswith(
        "python -m nystrom_lab.bench.packing --corpus"
    )
    rows = {r["layout"]: r for r in res["rows"]}
    padded, packed, stream = rows["padded"], rows["packed"], rows["stream"]
    assert padded["tokens"] == packed["tokens"]  # the same examples, laid out otherwise
    assert packed["rows"] < padded["rows"] and packed["padding_share"] < padded["padding_share"]
    assert stream["padding_share"] < 1 / stream["rows"]  # only the last row is short
    assert padded["rows_per_step"] == 128 // 64
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and r["step_ms"] > 0, r
    assert packed["speedup"] > 0 and "speedup" not in padded
    table = (tmp_path / "out" / "bench_packing.md").read_text()
    assert table in capsys.readouterr().out and table.count("| 64 |") == 3
    with pytest.raises(SystemExit):
        main(["--corpus", str(tmp_path / "missing.txt")])
