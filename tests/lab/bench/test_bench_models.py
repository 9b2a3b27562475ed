"""``nystrom bench models`` at a tiny size: every model builds and runs in both modes, the driver writes its
table with ratios, and a failing case is reported with its error (timing belongs in the benchmark)."""

from __future__ import annotations

import json

import pytest

from nystrom_lab.bench.floors import model_floor_flops
from nystrom_lab.bench.models.cases import MODELS, SIZES, measure
from nystrom_lab.bench.models.driver import add_ratios, render, run


@pytest.mark.parametrize("model", MODELS)
def test_every_model_runs_both_modes_at_a_tiny_size(model):
    for mode in ("inference", "train"):
        res = measure({"model": model, "mode": mode, "n": 128, "batch": 2, "size": "tiny", "repeats": 1})
        assert "error" not in res, res
        assert len(res["s"]) == 1 and res["s"][0] > 0 and res["peak_mb"] >= 0


def test_a_failing_case_reports_its_error():
    res = measure({"model": "ours-nystrom", "mode": "inference", "n": 128, "batch": 1,
                   "size": "tiny", "repeats": 1, "max_positions": 64})  # fmt: skip
    assert "error" not in res  # unknown keys of a case are ignored; the model's table holds n positions
    res = measure({"model": "nope", "mode": "inference", "n": 128, "batch": 1, "size": "tiny",
                   "repeats": 1})  # fmt: skip
    assert res["error"].startswith("ValueError: unknown model 'nope'; choose from ('ours-nystrom',")


def test_driver_writes_table_with_ratios(tmp_path):
    report = run(size="tiny", lengths=(128,), models=("ours-nystrom", "ours-softmax", "hf-nystromformer"),
                 modes=("inference",), rounds=1, repeats=1, out_dir=tmp_path, progress=False)  # fmt: skip
    rows = {r["model"]: r for r in report["rows"]}
    assert set(rows) == {"ours-nystrom", "ours-softmax", "hf-nystromformer"}
    ours = rows["ours-nystrom"]
    assert ours["vs_fastest_other"]["model"] == "hf-nystromformer" and ours["vs_ours_exact"]["speedup"] > 0
    assert ours["x_floor"] > 0 and ours["tokens_per_s"] == pytest.approx(128 / ours["median_s"])
    md = (tmp_path / "bench_models.md").read_text()
    assert "| 128 | 1 | ours-nystrom |" in md and json.loads((tmp_path / "bench_models.json").read_text())["rows"]
    assert (tmp_path / "bench_models.png").read_bytes()[:4] == b"\x89PNG"


def test_an_interrupted_run_resumes_where_it_stopped(tmp_path):
    """A killed run leaves its finished cases in bench_models.partial.jsonl (a torn last line included);
    the same command reuses them, measures the rest, and removes the file; other settings raise."""
    opts = dict(size="tiny", lengths=(128,), models=("ours-nystrom", "hf-nystromformer"), modes=("inference",),
                rounds=1, repeats=1, out_dir=tmp_path, progress=False)  # fmt: skip
    settings = {"size": "tiny", "lengths": [128], "batches": [1], "models": ["ours-nystrom", "hf-nystromformer"],
                "modes": ["inference"], "rounds": 1, "repeats": 1, "dtype": "fp32", "device": "cpu", "threads": 0}  # fmt: skip
    partial = tmp_path / "bench_models.partial.jsonl"
    done = {"round": 0, "key": ["inference", 128, 1, "ours-nystrom"], "result": {"s": [7.5], "peak_mb": 3.0}}
    partial.write_text(json.dumps({"settings": settings}) + "\n" + json.dumps(done) + '\n{"round": 0, "ke')
    report = run(**opts)
    rows = {r["model"]: r for r in report["rows"]}
    assert rows["ours-nystrom"]["median_s"] == 7.5 and rows["ours-nystrom"]["peak_mb"] == 3.0  # reused, not rerun
    assert 0 < rows["hf-nystromformer"]["median_s"] < 7.5 and report["resumed_cases"] == 1
    assert not partial.exists()
    partial.write_text(json.dumps({"settings": {**settings, "rounds": 3}}) + "\n")
    with pytest.raises(ValueError, match="interrupted run with other settings"):
        run(**opts)


def test_ratios_and_floor_by_hand():
    size = SIZES["minilm"]
    rows = [{"mode": "train", "n": 4096, "batch": 1, "model": m, "median_s": s, "peak_mb": mb, "spread": 1.0,
             "tokens_per_s": 4096 / s}
            for m, s, mb in (("ours-nystrom", 2.0, 1000.0), ("ours-softmax", 6.0, 1500.0),
                             ("hf-nystromformer", 5.0, 2000.0), ("hf-longformer", 20.0, 4000.0))]  # fmt: skip
    rows.append({"mode": "train", "n": 4096, "batch": 1, "model": "hf-bigbird", "error": "MemoryError: x"})
    add_ratios(rows, size, {4096: 100.0})
    ours = rows[0]
    assert ours["vs_fastest_other"] == {"model": "hf-nystromformer", "speedup": 2.5, "memory": 0.5}
    assert ours["vs_ours_exact"] == {"speedup": 3.0, "memory": pytest.approx(2 / 3)}
    flops = model_floor_flops(size, n=4096, batch=1, mode="train")
    assert ours["floor_s"] == pytest.approx(flops / 100e9) and ours["x_floor"] == pytest.approx(2.0 / ours["floor_s"])
    # 6 layers × 4096 tokens × 2·(4·384² + 2·384·1536) = 87.0 GFLOP of projections and FFN, plus the Nyström
    # core 6 × 4096 × 8·64·384 = 4.8 GFLOP: the ≈ 92 GFLOP forward of the whole-model benchmark's estimate
    assert model_floor_flops(size, n=4096, batch=1, mode="inference") == pytest.approx(91.8e9, rel=1e-3)
    text = render({"size": "minilm", "dtype": "fp32", "rounds": 1, "repeats": 1, "rows": rows,
                   "machine": {"cpu": "x", "threads": 2, "torch": "t", "transformers": "t"}})  # fmt: skip
    assert "MemoryError: x" in text and "2.50× faster, 0.50× memory (hf-nystromformer)" in text


def test_the_command_refuses_other_suites_options_and_theirs_refuse_its(capsys):
    from nystrom_lab.cli import main

    assert main(["bench", "models", "--heads", "4"]) == 2
    assert "['--heads'] do not apply" in capsys.readouterr().err
    assert main(["bench", "table1", "--rounds", "2"]) == 2
    assert main(["bench", "models", "--models", "ours-nystrom,bogus", "--out", "/tmp/unused-bench"]) == 2
    assert "unknown ['bogus']" in capsys.readouterr().err
