"""The GPU script's ``fused`` stage: the fused Triton kernels measured where they run (issue 48, item 14).

``python -m nystrom_lab.bench.gpu.driver fused OUT [--budget S] [--dry]`` (a stage of
``scripts/gpu_bench.sh``); setting: bf16, b = 1, h = 8, d = 64, m = 64, the conv skip's 33 taps, n = 4096
and 16384. In order (the process is fresh for the first; every part is guarded: an error is recorded in
its file and the next part runs; each stops its cases as the stage's deadline nears):

d. ``fused_memory.json``: ``torch.cuda.mem_get_info()`` and the allocator's counts before and after the
   first forward + backward (what loading the kernels reserves outside the allocator: their code and
   the local memory of spilled registers), and the compiled kernels' registers and spill bytes;
c. (starts) worker processes compile every configuration of the sweep into Triton's cache
   (:mod:`.workers`), while
a. ``fused_profile.json``: per-kernel device µs per call from ``torch.profiler``, forward (inference)
   and forward + backward, the conv skip on and off, beside SDPA (flash) in the same process; ratios;
e. ``fused_long.json`` (in a process of its own, :mod:`.checks`, after (a)): n = 180 000, h = 32,
   d = 128, q, k, v views of one (1, n, 3·h·d) projection (offsets past 2³¹): fused against the PyTorch
   path on the last and first 1024 rows, finite; then the gradients of the last rows if time is left;
f. ``fused_devices.json`` (the same process): with two GPUs, inputs on ``cuda:1`` while ``cuda:0`` is
   current give the output and gradients of the call on ``cuda:0``; else "skipped: one GPU";
b. ``fused_graphs.json``: ``NystromAttention`` eager (host issue time and wall time per call) against
   its CUDA-graph replay, inference and a training step;
c. ``fused_sweep.json`` / ``fused_tuning.json``: the sweep's times and the chosen launch configuration
   per kernel (format: :mod:`.sweep`), with whole calls timed with the defaults and with the choice;
   ``fused_summary.md``: the short summary, also printed.

``--dry``: the same parts on the CPU under ``TRITON_INTERPRET=1`` at tiny sizes (CUDA-only parts are
recorded as skipped; the times mean nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: the files the stage writes (docs/gpu/ names: ``gpu_bench_commit.sh`` copies them)
FILES = ("fused_memory.json", "fused_profile.json", "fused_graphs.json", "fused_sweep.json",
         "fused_tuning.json", "fused_long.json", "fused_devices.json", "fused_summary.md")  # fmt: skip
#: seconds kept at the end for the files and the exit
TAIL_S = 4.0
#: seconds kept after the compile phase (workers, the checks process) for (b), the sweep's timing and the
#: final check (a dry run's interpreter needs more)
TIMING_S, DRY_TIMING_S = 40.0, 45.0
WORKERS_MAX = 8


def _workers() -> int:
    return max(1, min(WORKERS_MAX, (os.cpu_count() or 2) // 2))


def run(out: Path, *, dry: bool, until: float, inline: bool = False) -> dict:
    """The stage, ending by ``until`` (a ``time.monotonic()`` value). ``inline``: no worker or checks
    processes (the checks run here, nothing is precompiled): the tests' way."""
    if dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    from nystrom_lab.bench.gpu.fused_stage import checks, final, profile, sweep, workers
    from nystrom_lab.bench.gpu.fused_stage.common import Clock, environment, guarded, read, setting, write

    s = setting(dry)
    clock = Clock(until - TAIL_S)
    for name in FILES:  # an earlier run's files in the same folder must not pass for this run's
        (out / name).unlink(missing_ok=True)
    env = environment(s)
    write(out, "memory", guarded({**env}, lambda: checks.memory(s)))

    compile_until = clock.until - (DRY_TIMING_S if dry else TIMING_S)
    go = out / ".fused_go"
    go.unlink(missing_ok=True)
    procs, child, started = [], [], {}

    def spawn() -> dict:  # the compile workers, and the checks' process (it waits for `go`)
        procs.extend(workers.start_workers(out, 1 if dry else _workers(), compile_until, dry))
        cmd = [sys.executable, "-m", "nystrom_lab.bench.gpu.fused_stage.checks", str(out), "--until",
               repr(compile_until), "--go", str(go)] + (["--dry"] if dry else [])  # fmt: skip
        with (out / ".fused_checks.log").open("w") as logf:
            child.append(subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT))
        return {"workers": len(procs)}

    if not inline:
        started = guarded({}, spawn)

    write(out, "profile", guarded({**env}, lambda: profile.profile(s, Clock(compile_until))))
    go.touch()
    if inline:
        checks.run_checks(out, s, Clock(compile_until))
    else:
        code = workers.stop(child, compile_until + 3) or [f"not started ({started.get('error')})"]
        log = out / ".fused_checks.log"
        for name in ("long", "devices"):  # the process died before writing its file: say how
            if not read(out, name):
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                why = f"the checks process ended with {code[0]} before writing it"
                write(out, name, {**env, "error": why, "log_tail": tail})
    codes = workers.stop(procs, compile_until + 2)

    write(out, "graphs", guarded({**env}, lambda: profile.graphs(s, Clock(clock.until - 0.5 * TIMING_S))))

    compiled = None if inline else workers.compile_log(out)
    result = guarded({**env, "workers": {**started, "exit_codes": codes}},
                     lambda: sweep.sweep(s, clock, compiled, margin=6.0))  # fmt: skip
    write(out, "sweep", result)
    chosen = result.get("chosen", {})
    checked = guarded({}, lambda: final.check(s, chosen, clock))
    tuning = final.tuning(s, result, checked, env) if "units" in result else {**result, "format": 1}
    write(out, "tuning", tuning)
    text = summary(out)
    (out / "fused_summary.md").write_text(text)
    print(text)
    return result


def _f(x, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _e(x) -> str:
    return "—" if x is None else f"{x:.2e}"


def summary(out: Path) -> str:
    """``fused_summary.md`` from the files written."""
    from nystrom_lab.bench.gpu.fused_stage.common import read

    mem, prof, graphs = read(out, "memory"), read(out, "profile"), read(out, "graphs")
    sw, tune, long, two = read(out, "sweep"), read(out, "tuning"), read(out, "long"), read(out, "devices")

    def problem(part: dict) -> str | None:
        return part.get("error") or part.get("skipped")

    lines = [f"# Fused kernels on {mem.get('gpu', '?')}", "",
             f"Setting: {mem.get('setting', {})}; torch {mem.get('torch')}, triton {mem.get('triton')}.", "",
             "## Memory of the first forward + backward (d)"]  # fmt: skip
    lines.append(problem(mem) or (
        f"free drop {mem['free_drop_mib']} MiB, allocator growth {mem['allocator_growth_mib']} MiB,"
        f" outside the allocator {mem['outside_allocator_mib']} MiB (local-memory estimate"
        f" {mem['local_reservation_estimate_mib']} MiB); first call {mem['first_call_s']} s"))  # fmt: skip
    lines += ["", "## Device time per call, µs (a)", "",
              "| n | mode | fused | fused, no conv | SDPA | fused ÷ SDPA |", "|---:|---|---:|---:|---:|---:|"]
    rows = {(r["n"], r["mode"], r["method"]): r for r in prof.get("rows", [])}
    ratio = {(r["n"], r["mode"], r["method"]): r["over_sdpa"] for r in prof.get("ratios", [])}
    for n, mode in sorted({(r["n"], r["mode"]) for r in prof.get("rows", [])}):
        cells = [_f(rows.get((n, mode, m), {}).get("total_us")) for m in ("fused", "fused-noconv", "sdpa")]
        lines.append(f"| {n} | {mode} | {' | '.join(cells)} | {_f(ratio.get((n, mode, 'fused')), 3)} |")
    if problem(prof):
        lines.append(f"\n{problem(prof)}")
    lines += ["", "## Module eager against its CUDA graph, ms per call (b)", "",
              "| n | mode | eager host | eager wall | graph | eager ÷ graph |",
              "|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in graphs.get("rows", []):
        cells = [_f(r.get(k), 3) for k in ("eager_host_ms", "eager_wall_ms", "graph_ms")]
        cells += [_f(r.get("eager_over_graph"), 2)]
        why = problem(r)
        body = f"{why[:80]} | | | |" if why else " | ".join(cells) + " |"
        lines.append(f"| {r['n']} | {r['mode']} | {body}")
    lines += ["", "## Sweep (c): chosen launch configuration", "",
              "| kernel | default | chosen | speedup | timed / tried |", "|---|---|---|---:|---:|"]
    for u in sw.get("units", []):
        tried, timed = len(u.get("configs", [])), sum("score" in c for c in u.get("configs", []))
        chosen = u.get("chosen", problem(u) or "—")
        lines.append(f"| `{u['kernel']}` | {u.get('default', '—')} | {chosen} | {_f(u.get('speedup'), 2)} | "
                     f"{timed} / {tried} |")  # fmt: skip
    for mode, per_n in (tune.get("check") or {}).items():
        for n, r in per_n.items() if isinstance(per_n, dict) else ():
            lines.append(f"\n{mode} n = {n}: default {_f(r.get('default_ms'), 3)} ms, "
                         f"chosen {_f(r.get('chosen_ms'), 3)} ms")  # fmt: skip
    if problem(sw):
        lines.append(f"\n{problem(sw)}")
    size = f"n = {long.get('n')}, h = {long.get('heads')}, d = {long.get('dim_head')}"
    lines += ["", f"## {size} against the PyTorch path (e)"]
    lines.append(problem(long) or (
        f"ok {long.get('ok')}: relative error {_e(long.get('rel_err_last_rows'))} on the last"
        f" {long.get('rows')} rows, {_e(long.get('rel_err_first_rows'))} on the first; finite"
        f" {long.get('finite')}; offsets past 2³¹: {long.get('passes_2_31')}; backward:"
        f" {long.get('backward')}"))  # fmt: skip
    lines += ["", "## cuda:1 with cuda:0 current (f)", problem(two) or f"ok {two.get('ok')}: {two}", ""]
    return "\n".join(str(line) for line in lines)
