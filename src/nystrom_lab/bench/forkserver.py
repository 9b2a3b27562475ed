"""Benchmark cases in fresh processes without a fresh interpreter each: a worker forks one per case.

Why: ``python -m`` per case spends seconds on the interpreter and the torch import (``nystrom bench
--quick``: ≈ 8 s a case, 214 s for 24 cases). :class:`CaseServer` starts one worker that imports the
case function's module once, then forks a process per case, so each case still starts from the state
of a fresh process after its imports: no allocator, cache or heap state of an earlier case, and a case
that crashes or overruns its timeout is killed alone while the worker goes on.

What a fork does not carry over, restored in the case process before the case runs:

- The shared-library pages the worker had mapped: fork copies no page-table entries of read-only file
  mappings, so the case would fault them in again and count them as resident memory (measured at
  n = 512, h = 4: +2.4 MB for SDPA, +4 MB for Nyström-64 over the 7 and 13 MB a fresh process reads).
  The case process maps the worker's resident ranges (``MADV_POPULATE_READ``) before it starts; its
  peak then reads as in a fresh process (within 0.4 MB in the tests' cases).
- OpenMP threads: GNU OpenMP hangs in a child forked after its thread pool started (measured), and
  ``import torch`` starts it. The worker runs with ``OMP_NUM_THREADS=1`` (no pool); a case process
  puts the variable back as it was and sets torch's thread count to the driver's.

Protocol: the driver writes one JSON line ``{"case": {...}, "timeout_s": t}`` to the worker's stdin;
the worker answers one line: ``{"result": {...}}``, ``{"error": "..."}`` (the last lines of the case's
output, as :func:`nystrom_lab.bench.harness.run_case` reports a failed child) or ``{"timeout": true}``.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

from nystrom_lab.bench.measure import CHILD_ENV

_OMP = "OMP_NUM_THREADS"
_OMP_SAVED = "NYSTROM_FORKSERVER_OMP_NUM_THREADS"  # the driver's value ("" = unset), for the cases
_MADV_POPULATE_READ = 22  # Linux ≥ 5.14
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
START_S = 300.0  # allowance for the worker's start-up (the torch import) on top of a case's timeout


class CaseServer:
    """Driver side: ``run(case)`` runs ``target(case)`` (``"module:function"``, returning a JSON-able
    dict) in a process forked from one worker; the worker starts on the first case and again after it
    died."""

    def __init__(self, target: str, *, threads: int, env: dict[str, str] | None = None) -> None:
        self.target, self.threads, self.env = target, threads, env or {}
        self._proc: subprocess.Popen | None = None
        self._log = None
        self._buf = b""

    def __enter__(self) -> CaseServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The worker's pid (None before the first case)."""
        return None if self._proc is None else self._proc.pid

    def _start(self) -> None:
        env = {**os.environ, **CHILD_ENV, **self.env, _OMP: "1", _OMP_SAVED: os.environ.get(_OMP, "")}
        self._log = tempfile.TemporaryFile()  # the worker's own stderr: its tail explains a crash
        cmd = [sys.executable, "-m", "nystrom_lab.bench.forkserver", self.target, str(self.threads)]
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env
        )
        self._buf = b""

    def run(self, case: dict, *, timeout_s: float) -> dict:
        """The case's dict, or ``{"error": ...}``; raises ``subprocess.TimeoutExpired`` past ``timeout_s``."""
        fresh = self._proc is None or self._proc.poll() is not None
        if fresh:
            self.close()
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps({"case": case, "timeout_s": timeout_s}) + "\n").encode())
            self._proc.stdin.flush()
            reply = self._read_line(timeout_s + (START_S if fresh else 60.0))
        except BrokenPipeError:
            reply = None
        if reply is None:  # the worker died (or hung): report its stderr, start a new one next time
            return {"error": self._worker_error()}
        answer = json.loads(reply)
        if answer.get("timeout"):
            raise subprocess.TimeoutExpired(f"{self.target} {case}", timeout_s)
        return answer["result"] if "result" in answer else {"error": answer["error"]}

    def _read_line(self, timeout_s: float) -> bytes | None:
        """One line of the worker's stdout; None at its end or after ``timeout_s`` (the worker is killed)."""
        assert self._proc is not None and self._proc.stdout is not None
        fd, deadline = self._proc.stdout.fileno(), time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self._proc.kill()
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _worker_error(self) -> str:
        assert self._proc is not None and self._log is not None
        code = self._proc.wait()
        self._log.seek(0)
        tail = self._log.read().decode(errors="replace").strip().splitlines()[-3:]
        self.close()
        return " | ".join(tail) or f"case worker exit code {code}"

    def close(self) -> None:
        """Stop the worker (it ends at the end of its input; killed if it does not within 10 s)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


def _resident_file_ranges() -> list[tuple[int, int]]:
    """(address, length) of the pages of readable file mappings this process has mapped (Linux; else [])."""
    out: list[tuple[int, int]] = []
    try:
        with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
            for line in maps:
                parts = line.split()
                path = parts[5] if len(parts) >= 6 else ""
                if not path.startswith("/") or path.startswith(("/dev/", "/memfd:")) or "r" not in parts[1]:
                    continue  # regular files only: device mappings are no page cache to map
                start, end = (int(x, 16) for x in parts[0].split("-"))
                pagemap.seek(start // _PAGE * 8)
                present = [e >> 63 for e in memoryview(pagemap.read((end - start) // _PAGE * 8)).cast("Q")]
                run = None
                for i, p in enumerate([*present, 0]):
                    if p and run is None:
                        run = i
                    elif not p and run is not None:
                        out.append((start + run * _PAGE, (i - run) * _PAGE))
                        run = None
    except OSError:
        return []
    return out


def _populate(ranges: list[tuple[int, int]]) -> None:
    """Map ``ranges`` (from :func:`_resident_file_ranges` in the worker) into this forked process."""
    if not ranges:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for addr, length in ranges:
        if libc.madvise(addr, length, _MADV_POPULATE_READ) != 0:  # older kernel: touch each page
            for a in range(addr, addr + length, _PAGE):
                ctypes.string_at(a, 1)


def _die_with(worker: int) -> None:
    """Linux: have this case killed when its worker dies (a driver that kills the worker ends the case)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the worker's timeout still bounds the case
        return
    if os.getppid() != worker:  # the worker died before the call above
        os._exit(1)


def _run_case(fn: Callable[[dict], dict], case: dict, threads: int, result_fd: int) -> None:
    """In the forked case process: restore what fork leaves out, run the case, write its JSON."""
    saved = os.environ.pop(_OMP_SAVED, "")
    if saved:
        os.environ[_OMP] = saved
    else:
        os.environ.pop(_OMP, None)
    import torch

    torch.set_num_threads(threads)
    os.write(result_fd, json.dumps(fn(case)).encode())


def _fork_case(fn: Callable[[dict], dict], case: dict, threads: int, timeout_s: float) -> dict:
    """Fork, run the case in the child, and wait for it (killed after ``timeout_s``); the reply."""
    if os.path.isdir("/proc/self/task") and len(os.listdir("/proc/self/task")) > 1:
        raise RuntimeError("the case worker has started a thread: a forked case could deadlock")
    ranges = _resident_file_ranges()
    res_r, res_w = os.pipe()
    log_r, log_w = os.pipe()
    worker, pid = os.getpid(), os.fork()
    if pid == 0:  # the case process: never returns
        code = 1
        try:
            _die_with(worker)
            os.close(res_r)
            os.close(log_r)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the worker's input is the driver's, not the case's
            os.dup2(log_w, 1)
            os.dup2(log_w, 2)
            _populate(ranges)
            _run_case(fn, case, threads, res_w)
            code = 0
        except BaseException:
            traceback.print_exc()  # into the log: its last lines are the case's error
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(res_w)
    os.close(log_w)
    result, log, open_fds = b"", b"", {res_r, log_r}
    deadline = time.monotonic() + timeout_s
    while open_fds:
        left = deadline - time.monotonic()
        ready = select.select(list(open_fds), [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            for fd in open_fds:
                os.close(fd)
            return {"timeout": True}
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                os.close(fd)
            elif fd == res_r:
                result += chunk
            else:
                log = (log + chunk)[-65536:]
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code == 0 and result:
        return {"result": json.loads(result)}
    tail = log.decode(errors="replace").strip().splitlines()[-3:]
    return {"error": " | ".join(tail) or f"exit code {code}"}


def resolve(target: str) -> Callable[[dict], dict]:
    """The case function ``target`` (``"module:function"``) names, its module imported."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def serve(target: str, threads: int) -> None:
    """The worker: import ``target``, then answer each case line on stdin (see the module docstring)."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the replies
    fn = resolve(target)
    for line in sys.stdin:
        if line.strip():
            request = json.loads(line)
            reply = _fork_case(fn, request["case"], threads, request["timeout_s"])
            replies.write(json.dumps(reply) + "\n")
            replies.flush()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
