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
    n = 1K, two more models; then the fused stage)."""
    import re

    text = (ROOT / "scripts" / "gpu_bench.sh").read_text()
    budgets = [int(b) for b in re.findall(r"^stage \"?[\w ]+\"? (\d+) ", text, flags=re.M)]
    end = int(re.search(r"END=\$\{END:-(\d+)\}", text).group(1))
    # ≥ 75 s left for the models stage: eager + CUDA graph ~70 s and its tail (the compiled case runs only
    # when what the stages before left gives it ≥ COMPILED_FROM_S)
    assert len(budgets) == 9 and sum(budgets) + 75 <= end
    assert gpu_bench.COMPILED_FROM_S >= 70 + gpu_bench.COMPILED_S + gpu_bench.MODELS_TAIL_S
    assert end + 10 + 5 <= 590  # the last stage's timeout and its kill grace


def test_the_fused_stage_dry_runs_every_part_and_writes_its_files(tmp_path, monkeypatch):
    """The ``fused`` stage on the CPU under Triton's interpreter (inline: no worker processes), cut to
    one call of each kind: every part runs or says why not (CUDA-only parts: skipped), every file is
    written, and the tuning file holds a ``launch.tuned`` mapping."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: scripts/gpu_bench.sh runs the stage for real")
    import time

    from nystrom.ops.nystrom.fused.launch import tuned
    from nystrom_lab.bench.gpu import fused_stage
    from nystrom_lab.bench.gpu.fused_stage import profile, sweep

    monkeypatch.setattr(profile, "MODES", ("fwd",))
    monkeypatch.setattr(profile, "METHODS", (("fused", None), ("sdpa", 0)))
    monkeypatch.setattr(profile, "GRAPH_MODES", ("inference",))
    units = tuple(u for u in sweep.UNITS if u.kernel in ("query_pass", "key_backward"))
    monkeypatch.setattr(sweep, "UNITS", units)
    monkeypatch.setattr(sweep, "DRY_CONFIGS", 1)
    monkeypatch.setattr(sweep, "MODES", ("fwd",))
    fused_stage.run(tmp_path, dry=True, until=time.monotonic() + 600, inline=True)

    assert all((tmp_path / name).exists() for name in fused_stage.FILES)
    assert set(fused_stage.FILES) <= set(gpu_bench.FILES)  # gpu_bench_commit.sh copies them
    read = lambda name: json.loads((tmp_path / f"fused_{name}.json").read_text())  # noqa: E731
    assert "needs CUDA" in read("memory")["skipped"] and "needs CUDA" in read("devices")["skipped"]
    profiled = read("profile")
    assert [r.get("error") for r in profiled["rows"]] == [None, None]
    assert profiled["rows"][0]["triton_launches_per_call"] == 5  # the fused forward's five launches
    assert profiled["ratios"][0]["over_sdpa"] > 0
    assert "eager_wall_ms" in read("graphs")["rows"][0]
    long = read("long")
    assert long["ok"] and long["backward"]["ok"], long
    units = read("sweep")["units"]
    assert [u["kernel"] for u in units] == ["key_backward", "query_pass"]
    assert all(len(u["configs"]) == 1 and "score" in u["configs"][0] for u in units), units
    tuning = read("tuning")
    assert tuning["format"] == 1 and set(tuning["chosen"]) == {"key_backward", "query_pass"}
    assert set(tuning["chosen"]["query_pass"]) == {"num_warps", "num_stages", "BN"}
    with tuned(tuning["chosen"]):  # the mapping launch.tuned takes
        pass
    assert "## Sweep (c)" in (tmp_path / "fused_summary.md").read_text()


def test_the_fused_profile_groups_device_kernels_by_name():
    """The profiler's CUDA kernel events of a call: the fused kernels by name (a suffix of argument
    attributes, as older Tritons add, dropped), the rest as ATen's; CPU events left out."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from nystrom_lab.bench.gpu.fused_stage.profile import kernel_times

    def event(name, us, device=DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=device, cpu_parent=None,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))  # fmt: skip

    reduce = "void at::native::reduce_kernel<512, 1>(int)"
    events = [event("key_pass", 10.0), event("key_pass_0d1d2de", 12.0), event("query_landmarks", 4.0),
              event(reduce, 6.0), event("cuLaunchKernel", 99.0, DeviceType.CPU)]  # fmt: skip
    got = kernel_times(events, 2, "cuda")
    assert got["kernels"] == {"key_pass": 11.0, "aten: " + reduce[5:]: 3.0, "query_landmarks": 2.0}
    assert (got["total_us"], got["fused_kernels_us"], got["aten_us"]) == (16.0, 13.0, 3.0)
    assert got["device_events_per_call"] == 2.0


def test_the_packing_stage_dry_runs_both_paths_and_every_layout(tmp_path):
    """The ``packing`` stage's measurement on the CPU (the fused kernels under Triton's interpreter): every
    layout on both paths in both modes, each as a ratio to one document, and the table of them."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: scripts/gpu_bench.sh runs the stage for real")
    import time

    from nystrom_lab.bench.packing import cost_gpu

    record = cost_gpu.run(dry=True, until=time.monotonic() + 600)
    assert [(r["n"], r["mode"]) for r in record["rows"]] == [(128, "forward"), (128, "forward + backward")]
    layouts = list(cost_gpu.gpu_layouts(128, dry=True))
    assert layouts == ["one document", "4 equal", "half + 4 short"]
    skewed = cost_gpu.gpu_layouts(4096)["half + 64 short"]
    assert len(skewed) == 65 and skewed[0] == 2048 and sum(skewed) == 4096
    for row in record["rows"]:
        assert set(row["ms"]) == {"fused", "pytorch"}
        for path in ("fused", "pytorch"):
            assert list(row["ms"][path]) == layouts and row["over_one_document"][path]["one document"] == 1.0
    text = cost_gpu.table(record)
    assert text.count("\n") == 2 + 4 and "| 128 | forward + backward | pytorch |" in text
    assert "packing_gpu.json" in gpu_bench.FILES
