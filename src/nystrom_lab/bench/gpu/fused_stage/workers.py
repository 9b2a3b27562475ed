"""The sweep's compile phase: worker processes run every configuration's calls (:func:`.sweep.jobs`) so
that Triton compiles them into its disk cache, in parallel, before the timing process times them.

``python -m nystrom_lab.bench.gpu.fused_stage.workers OUT --worker I --workers N --until T [--dry]`` runs
every N-th job from I, logging each to ``OUT/.fused_compile/I.jsonl`` as it starts and as it ends (its
error, e.g. Triton's ``OutOfResources``, and its seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from nystrom_lab.bench.gpu.fused_stage.common import setting
from nystrom_lab.bench.gpu.fused_stage.sweep import UNITS, data, jobs, key, run_once


def worker(out: Path, index: int, count: int, until: float, dry: bool) -> None:
    """Run the calls of every ``count``-th job from ``index`` (Triton compiles and caches their kernels),
    logging each to ``out/.fused_compile/{index}.jsonl`` as it starts and ends."""
    s = setting(dry)
    units = {u.kernel: u for u in UNITS}
    inputs = {n: data(s, n) for n in s.lengths}
    with (out / ".fused_compile" / f"{index}.jsonl").open("a") as log:
        for kernel, config in jobs(dry)[index::count]:
            if time.monotonic() > until:
                break
            log.write(json.dumps({"job": key(kernel, config), "started": True}) + "\n")
            log.flush()
            start, error = time.monotonic(), None
            try:
                for n in s.lengths:
                    run_once(s, inputs[n], units[kernel], {kernel: config})
            except Exception as err:  # OutOfResources and the like: the timing process skips the job
                error = f"{type(err).__name__}: {err}"[:500]
            log.write(json.dumps({"job": key(kernel, config), "done": True, "error": error,
                                  "compile_s": round(time.monotonic() - start, 2)}) + "\n")  # fmt: skip
            log.flush()
            if error and ("CUDA error" in error or "illegal" in error):  # the context is lost: stop here
                break


def start_workers(out: Path, count: int, until: float, dry: bool) -> list[subprocess.Popen]:
    folder = out / ".fused_compile"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    procs = []
    for i in range(count):
        cmd = [sys.executable, "-m", "nystrom_lab.bench.gpu.fused_stage.workers", str(out), "--worker",
               str(i), "--workers", str(count), "--until", repr(until), *(["--dry"] if dry else [])]
        with (folder / f"{i}.log").open("w") as logf:
            procs.append(subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT))
    return procs


def stop(procs: list[subprocess.Popen], until: float) -> list[int | None]:
    """Wait for the processes until ``until``; kill those still running (they were started here)."""
    codes = []
    for p in procs:
        try:
            p.wait(timeout=max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        codes.append(p.returncode)
    return codes


def compile_log(out: Path) -> dict[str, dict]:
    """Job -> {"started", "done", "error", "compile_s"} from the workers' logs."""
    seen: dict[str, dict] = {}
    for path in sorted((out / ".fused_compile").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                entry = json.loads(line)
                seen.setdefault(entry.pop("job"), {}).update(entry)
    return seen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nystrom_lab.bench.gpu.fused_stage.workers")
    p.add_argument("out", type=Path)
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--until", type=float, required=True, help="time.monotonic() deadline")
    p.add_argument("--dry", action="store_true")
    a = p.parse_args(argv)
    worker(a.out, a.worker, a.workers, a.until, a.dry)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
