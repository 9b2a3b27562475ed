"""Smoke tests of the Table 1 benchmark, the approximation study and their commands (tiny sizes only)."""

import argparse
import json

import pytest
import torch

from nystrom.attention import SoftmaxAttention
from nystrom_lab.argtypes import UsageError
from nystrom_lab.bench.approx import driver as approx
from nystrom_lab.bench.approx.commands import register as register_approx
from nystrom_lab.bench.bench_commands import register
from nystrom_lab.bench.table1 import driver as table1


def _row(method, n, mb, ms):
    return {"method": method, "label": table1.METHODS[method][0], "n": n, "peak_mb": mb, "ms": ms}


def test_table1_render_paper_cells_and_ratios():
    rows = [
        _row("transformer", 4096, 2620.0, 32.9),
        _row("nystrom-64", 4096, 229.0, 5.9),
        _row("transformer", 8192, 10233.0, 155.4),
        _row("nystrom-64", 8192, 450.0, 12.3),
        _row("longformer-257", 4096, 263.0, 18.5),
        {"method": "longformer-257", "label": "Longformer-257", "n": 8192, "skipped": "n > --max-n 4096"},
    ]
    text = table1.render(rows)
    lines = text.splitlines()
    assert lines[0] == "| self-attention | 4096 MB | 4096 ms | 8192 MB | 8192 ms |"
    nys = next(line for line in lines if line.startswith("| Nyströmformer-64"))
    # the paper's own cells: 229 (11.4×) 5.90 (5.6×) 450 (22.7×) 12.3 (12.6×)
    assert nys == "| Nyströmformer-64 | 229 (11.4×) | 5.90 (5.6×) | 450 (22.7×) | 12.3 (12.6×) |"
    assert "| Transformer | 2620 (1.0×) | 32.9 (1.0×) |" in text
    lf = next(line for line in lines if line.startswith("| Longformer-257"))
    assert lf.endswith("| 263 (10.0×) | 18.5 (1.8×) | skip | skip |")
    assert "- Longformer-257 at n=8192: n > --max-n 4096" in text
    assert "SDPA" not in text  # methods without rows are left out


def test_table1_slower_method_gets_ratio_below_one():
    text = table1.render([_row("transformer", 512, 54.0, 0.8), _row("longformer-257", 512, 32.2, 2.4)])
    assert "| Longformer-257 | 32.2 (1.7×) | 2.40 (0.33×) |" in text


def test_materialized_baseline_matches_fused_softmax():
    torch.manual_seed(0)
    ours = table1.build_module("transformer", n=40, heads=2, dim_head=8)
    ref = SoftmaxAttention(16, heads=2, dim_head=8)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 40, 16)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 30:] = False
    torch.testing.assert_close(ours(x, mask)[:, :30], ref(x, mask)[:, :30], atol=1e-5, rtol=1e-5)


def test_child_entry_point_runs_one_case(capsys):
    from nystrom_lab.bench.harness import main

    case = {"method": "nystrom-32", "n": 96, "batch": 1, "heads": 2, "dim_head": 8, "dtype": "float32"}
    case |= {"device": "cpu", "backward": True, "repeats": 1, "budget": 1.0, "threads": 0}
    res = main([table1._TARGET, json.dumps(case)])
    assert res["ms"] > 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == res


def test_child_rejects_unavailable_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA is not available"):
        table1.check_device("cuda")


def test_table1_run_writes_outputs(tmp_path):
    md = tmp_path / "benchmarks.md"
    md.write_text("# B\n\n<!-- table1:start -->\nold\n<!-- table1:end -->\n\ntail\n")
    rows = table1.run(
        lengths=[64, 128],
        methods=("transformer", "linformer-256"),
        heads=2,
        dim_head=8,
        max_n=64,
        repeats=1,
        budget_s=0.5,
        out_dir=tmp_path,
        markdown=md,
        command="nystrom bench --test",
    )
    got = {(r["method"], r["n"]): r for r in rows}
    assert got[("linformer-256", 128)]["skipped"] == "n > --max-n 64"
    assert got[("transformer", 128)]["ms"] > 0 and "error" not in got[("linformer-256", 64)]
    text = md.read_text()
    assert "old" not in text and text.endswith("tail\n") and "`nystrom bench --test`" in text
    assert "| Linformer-256 |" in text and (tmp_path / "table1_fwd.png").stat().st_size > 1000
    assert (tmp_path / "table1_fwd.csv").read_text().count("\n") == 5  # header + 4 cases
    assert "each case in a fresh process forked from one worker that imported torch once;" in text
    assert all(r["peak_mb"] > 0 for r in rows if "ms" in r)


def _probe(case: dict) -> dict:
    """A case for the fork server (imported by its worker from this file): what its process looks like."""
    import os
    import time

    if case["do"] == "raise":
        raise ValueError("boom")
    if case["do"] == "sleep":
        time.sleep(60)
    if case["do"] == "exit":
        os._exit(3)
    omp = os.environ.get("OMP_NUM_THREADS")
    return {"pid": os.getpid(), "ppid": os.getppid(), "torch_threads": torch.get_num_threads(), "omp": omp}


def test_case_server_forks_every_case_from_one_worker(monkeypatch):
    """One worker per run, a fresh process per case: its result, error, timeout and crash are the case's
    own, the worker survives them (and is replaced when it dies itself)."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    from nystrom_lab.bench.forkserver import CaseServer

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])  # this file too
    with CaseServer("test_bench_smoke:_probe", threads=2, env={"PYTHONPATH": path}) as server:
        a, b = (server.run({"do": "ok"}, timeout_s=120) for _ in range(2))
        worker = server.pid
        assert a["ppid"] == b["ppid"] == worker and len({a["pid"], b["pid"], worker}) == 3
        # OpenMP: the worker runs with one thread (a fork after its pool started hangs); a case gets the
        # driver's setting back and the thread count it asked for
        assert a["omp"] == "2" and a["torch_threads"] == 2
        err = server.run({"do": "raise"}, timeout_s=120)["error"]
        assert "ValueError: boom" in err and server.pid == worker
        with pytest.raises(subprocess.TimeoutExpired):
            server.run({"do": "sleep"}, timeout_s=1)
        assert server.run({"do": "exit"}, timeout_s=120) == {"error": "exit code 3"}
        assert server.run({"do": "ok"}, timeout_s=120)["ppid"] == worker == server.pid
        os.kill(worker, signal.SIGKILL)  # the worker itself dies: the next case starts a new one
        os.waitpid(worker, 0)
        assert server.run({"do": "ok"}, timeout_s=120)["ppid"] == server.pid != worker


def test_forked_case_measures_memory_as_a_fresh_process():
    """The worker's mapped library pages are mapped again in a forked case: without that, this case's
    peak read 12.9 MB forked vs 9.8 MB in a fresh interpreter (code pages faulted in again)."""
    from nystrom_lab.bench.forkserver import CaseServer
    from nystrom_lab.bench.harness import run_case

    case = {"method": "nystrom-32", "n": 128, "batch": 1, "heads": 2, "dim_head": 8, "dtype": "float32"}
    case |= {"device": "cpu", "backward": False, "repeats": 1, "budget": 0.5, "threads": 0}
    fresh = run_case(table1._TARGET, case, timeout_s=300)
    with CaseServer(table1._TARGET, threads=torch.get_num_threads()) as server:
        forked = [server.run(case, timeout_s=300)["peak_mb"] for _ in range(2)]
    assert all(abs(f - fresh["peak_mb"]) < 1.0 for f in forked), (fresh, forked)


def test_approx_errors_decrease_with_budget_on_lowrank():
    q, k, v = approx.lowrank_qkv(64, heads=2, dim_head=16, seed=1)
    rows = approx.sweep(
        "lowrank",
        q,
        k,
        v,
        methods=("nystrom", "longformer", "linformer-pool", "uniform"),
        params=(4, 16, 64),
        trials=1,
    )
    err = {(r["method"], r["param"]): r["rel_err"] for r in rows}
    for method in ("nystrom", "longformer", "linformer-pool"):
        assert err[(method, 4)] > err[(method, 16)] > err[(method, 64)], method
    assert err[("nystrom", 64)] < 0.05  # m = n: landmarks are the tokens themselves
    assert err[("nystrom", 16)] < err[("uniform", 0)]


def test_reformer_reference_is_lsh_with_one_bucket():
    from nystrom.ops.baselines.reformer import lsh_attention, lsh_num_buckets, random_rotations

    q, _, v = approx.lowrank_qkv(32, heads=2, dim_head=8)
    rot = random_rotations(2, 8, lsh_num_buckets(32, 32), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        lsh_attention(q, v, rot, bucket_size=32), approx.shared_qk_attention(q, v), atol=1e-5, rtol=1e-5
    )
    assert (
        approx.relative_error(
            approx.approximate("reformer", q, q, v, 32, seed=0), approx.shared_qk_attention(q, v)
        )
        < 1e-5
    )


def test_approx_render_tables():
    rows = [
        {"family": "lowrank", "n": n, "method": me, "param": m, "rel_err": e}
        for n, me, m, e in [
            (64, "nystrom", 8, 0.5),
            (64, "nystrom", 32, 0.25),
            (128, "nystrom", 8, 0.6),
            (128, "nystrom", 32, 0.125),
            (128, "uniform", 0, 0.9),
            (64, "uniform", 0, 0.95),
        ]
    ]
    text = approx.render(rows, family="lowrank", focus=32)
    assert (
        "| method | m=8 | m=32 |\n|---|---:|---:|\n| nystrom | 0.600 | 0.125 |\n| uniform | 0.900 | 0.900 |"
        in text
    )
    assert "| nystrom | 0.250 | 0.125 |" in text and "| uniform | 0.950 | 0.900 |" in text


def _parse(argv):
    p = argparse.ArgumentParser(prog="nystrom")
    sub = p.add_subparsers(dest="command", required=True)
    register(sub)
    register_approx(sub)
    return p.parse_args(argv)


def test_commands_parse_and_reject_foreign_options():
    args = _parse(["bench"])
    assert args.suite == "table1" and args.func.__name__ == "_cmd_bench"
    assert _parse(["bench", "core", "--modes", "core,fwd"]).modes == ("core", "fwd")
    with pytest.raises(UsageError, match="--attention"):
        args.func(_parse(["bench", "--attention", "nystrom-32"]))  # core only
    assert _parse(["bench", "core", "--device", "cpu"]).device == "cpu"  # every suite takes --device
    with pytest.raises(UsageError, match="runs on the CPU only"):
        args.func(argparse.Namespace(**{**vars(_parse(["bench", "core"])), "device": "cuda"}))
    with pytest.raises(UsageError, match="unknown"):
        args.func(_parse(["bench", "--methods", "nystrom-64,bogus"]))
    assert _parse(["approx", "--quick"]).func.__name__ == "_cmd_approx"
    assert _parse(["bench", "--quick", "--fresh-process"]).fresh_process and not args.fresh_process
    with pytest.raises(UsageError, match="--fresh-process"):
        args.func(_parse(["bench", "core", "--fresh-process"]))


def test_training_bench_quick_writes_tables_plot_and_ratios(tmp_path):
    from nystrom_lab.bench.training import driver as training

    md = tmp_path / "benchmarks.md"
    args = _parse(["bench", "training", "--quick", "--out", str(tmp_path)])
    assert args.func(args) == 0
    data = json.loads((tmp_path / "bench_training.json").read_text())
    rows = {(r["regime"], r["impl"]): r for r in data["rows"]}
    assert set(rows) == {(g, i) for g in training.REGIMES for i in training.IMPLS}
    assert "HF's Nystromformer needs n divisible by m" not in str(rows[("paper", "hf")])
    for (_, impl), r in rows.items():
        assert r["ms"] > 0 and r["fwd_ms"] > 0 and r["bwd_ms"] > 0 and r["peak_mb"] >= 0
        assert impl == "nystrom" or r["speedup"] > 0
    assert data["listops"]["results"]["lucidrains"]["speedup"] > 0
    assert all(f["floor_ms"] > 0 for f in data["floors"])
    text = md.read_text()
    assert "<!-- bench-training:start -->" in text and "| 64 | nystrom |" in text
    assert "LRA ListOps training step" in text and (tmp_path / "training.png").stat().st_size > 0
    anchor_rows = [ln for ln in text.splitlines() if ln.startswith(("| paper | 64 |", "| transmil | 96 |"))]
    assert len(anchor_rows) == 2 and all(ln.count("×") >= 2 for ln in anchor_rows), anchor_rows
    with pytest.raises(UsageError, match="--lengths"):
        args.func(_parse(["bench", "training", "--lengths", "64"]))
    assert "allocator: " in text


def test_training_bench_malloc_option_is_checked():
    with pytest.raises(UsageError, match="needs fresh processes"):
        args = _parse(["bench", "training", "--quick", "--malloc", "cached"])
        args.func(args)
    for suite in ("table1", "core"):
        with pytest.raises(UsageError, match="--malloc"):
            args = _parse(["bench", suite, "--malloc", "cached"])
            args.func(args)


_FAULTS = """
import resource, torch
def touch():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.ones(64 << 18)  # 64 MiB: above glibc's largest mmap threshold
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(*[touch() for _ in range(16)])
"""


@pytest.mark.skipif(not __import__("platform").libc_ver()[0] == "glibc", reason="glibc tunables")
def test_malloc_cached_reuses_mapped_memory(monkeypatch):
    """The regression the ``--malloc cached`` mode exists for: under glibc's defaults a second 64 MiB
    tensor page-faults in every call (16384 4 KiB faults); cached, once warm, it reuses mapped pages."""
    import subprocess
    import sys

    from nystrom_lab.bench.measure import MALLOC, allocator_info, malloc_env

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    faults = {}
    for mode in ("system", "cached"):
        env = {**__import__("os").environ, **malloc_env(mode)}
        out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, check=True)
        faults[mode] = [int(f) for f in out.stdout.split()]
    # glibc's heap settles after a few calls (measured: 8; its holes first miss the aligned request)
    assert max(faults["cached"][-4:]) < 200 and min(faults["system"]) > 1000, faults
    assert "GLIBC_TUNABLES=" + MALLOC["cached"]["GLIBC_TUNABLES"] in allocator_info(MALLOC["cached"])
    assert allocator_info({}).endswith("default settings")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=1")
    with pytest.raises(ValueError, match="already set"):
        malloc_env("cached")


def test_training_floor_counts_projections_core_conv_and_pinv():
    from nystrom_lab.bench.floors import attention_layer_training_floor_ms

    n, e = 4096, 512
    for m in (64, 256):
        regime = dict(h=8, d=64, m=m, conv=33)
        flops = 24 * n * e * e + 28 * n * m * e + 6 * 33 * n * e + 6 * 4 * 2 * m**3 * 8 * 3  # pinv: fwd + 2x bwd
        assert attention_layer_training_floor_ms(regime, n, 100.0) == pytest.approx(flops / 1e11 * 1e3)
