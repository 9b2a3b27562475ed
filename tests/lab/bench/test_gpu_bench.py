"""The time-boxed GPU benchmark (scripts/gpu_bench.sh) on the CPU: its stages' Python parts at tiny sizes,
the outside modules of Table 1, the time budget and the copy of a run into docs/gpu/."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from nystrom_lab.bench.gpu import driver as gpu_bench
from nystrom_lab.bench.models.driver import run as run_models
from nystrom_lab.bench.table1 import driver as table1
from nystrom_lab.bench.table1.case import measure

ROOT = Path(__file__).resolve().parents[3]

CASE = dict(
    n=128, batch=1, heads=2, dim_head=16, device="cpu", backward=False, repeats=1, budget=0.1, threads=1
)


@pytest.mark.parametrize("method", ["hf-nystrom-64", "lucidrains-64", "transmil", "transmil-lucidrains"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_outside_modules_run_as_table1_cases(method, dtype):
    if "lucidrains" in method:
        pytest.importorskip("nystrom_attention")
    pytest.importorskip("transformers")
    res = measure({**CASE, "method": method, "dtype": dtype, "backward": dtype == "bfloat16"})
    assert res["ms"] > 0


def test_transmil_layer_is_a_prenorm_residual_over_our_lucidrains_drop_in():
    from nystrom.compat.lucidrains import NystromAttention

    mod = table1.build_module("transmil", n=64, heads=8, dim_head=64).eval()
    assert isinstance(mod.attn, NystromAttention)
    assert (mod.attn.num_landmarks, mod.attn.pinv_iterations, mod.attn.residual) == (256, 6, True)
    x = torch.randn(1, 64, 512)
    with torch.no_grad():
        torch.testing.assert_close(mod(x), x + mod.attn(mod.norm(x)))


def test_table_past_its_deadline_still_writes_every_row(tmp_path):
    rows = table1.run(lengths=(128,), methods=("sdpa", "hf-nystrom-64"), heads=2, dim_head=16, out_dir=tmp_path,
                      markdown=None, deadline_s=0.0)  # fmt: skip
    assert [r["skipped"] for r in rows] == ["over the run's time budget (0 s)"] * 2
    assert (tmp_path / "table1_fwd.csv").exists()


def test_graphed_models_on_the_cpu_are_reported_skipped_with_a_reason(tmp_path):
    report = run_models(size="tiny", lengths=(64,), models=("ours-nystrom-graphed", "ours-nystrom-compiled"),
                        rounds=1, repeats=1, out_dir=tmp_path, name="g", progress=False, threads=1)  # fmt: skip
    why = {(r["model"], r["mode"]): r["skipped"] for r in report["rows"]}
    assert len(why) == 4 and all("needs a CUDA device" in w for w in why.values())
    assert "skipped: ours-nystrom-graphed" in (tmp_path / "g.md").read_text()
    from nystrom_lab.bench.models.cases import refusal

    assert "inference only" in refusal("ours-nystrom-graphed", "train", "cuda")
    assert refusal("ours-nystrom-compiled", "train", "cuda") is None


def test_commit_refuses_a_dry_run_and_replaces_the_committed_run_whole(tmp_path, capsys):
    out, root = tmp_path / "out", tmp_path / "repo"
    gpu = root / "docs" / "gpu"
    gpu.mkdir(parents=True)
    gpu_bench.env(out.mkdir() or out, dry=True)
    with pytest.raises(SystemExit, match="dry run"):
        gpu_bench.commit(out, root=root, render=False)
    (out / "DRY").unlink()
    # an earlier run's tables: the new run has no fp16 table and cut its fp32 one
    for name in ("table1_float16_fwd.csv", "table1_float32_fwd.csv", "launches.json"):
        (gpu / name).write_text("earlier run\n")
    with (out / "table1_float32_fwd.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["method", "n", "ms", "skipped"])
        w.writeheader()
        w.writerow({"method": "sdpa", "n": 4096, "skipped": "over the run's time budget (30 s)"})
    (out / "bench_models_gpu_graphed.json").write_text(
        json.dumps({"rows": [{"model": "x", "median_s": 1.0}]})
    )
    (out / "stages.log").write_text("env rc=0 6 s\n")
    (out / "README.md").write_text("# One run\n")
    assert gpu_bench.commit(out, root=root, render=False) == [
        "env.txt",
        "stages.log",
        "bench_models_gpu_graphed.json",
    ]
    # neither the earlier run's fp16 table nor its fp32 one stays beside this run's files
    assert not (gpu / "table1_float16_fwd.csv").exists() and not (gpu / "table1_float32_fwd.csv").exists()
    assert (gpu / "launches.json").exists()  # not a file of the run: left alone
    assert (gpu / "README.md").read_text() == "# One run\n"
    assert "table1_float32_fwd.csv has 1 case(s) over the time budget" in capsys.readouterr().out
    assert "table1_float32_fwd.csv" in gpu_bench.commit(out, root=root, render=False, force=True)


def test_a_stage_budget_counts_from_the_process_start(monkeypatch):
    monkeypatch.setattr(gpu_bench, "T0", gpu_bench.time.monotonic() - 20.0)  # 20 s of imports so far
    assert 31.0 < gpu_bench.left(60.0, 8.0) <= 32.0
    assert gpu_bench.left(10.0) < 0


def test_the_script_budgets_fit_under_ten_minutes():
    """The stage budgets (and END, the models stage's end) leave room for a backstop kill within 590 s
    (8 minutes before the fused kernels: their first compiles in the gpu tests, their PyTorch-path rows,
    n = 1K, two more models)."""
    import re

    text = (ROOT / "scripts" / "gpu_bench.sh").read_text()
    budgets = [int(b) for b in re.findall(r"^stage \"?[\w ]+\"? (\d+) ", text, flags=re.M)]
    end = int(re.search(r"END=\$\{END:-(\d+)\}", text).group(1))
    # ≥ 130 s left for the models stage: eager + CUDA graph ~70 s, the compiled case 50 s, its tail 6 s
    assert len(budgets) == 7 and sum(budgets) + 130 <= end
    assert end + 10 + 5 <= 590  # the last stage's timeout and its kill grace
