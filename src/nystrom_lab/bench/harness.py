"""The runner every benchmark table uses: one case → a fresh process → its measurement → a JSON record.

A case is a JSON-able dict; its target, ``"module:function"``, is the function that measures it inside the
case's process and returns a JSON-able dict. Why a fresh process per case: peak memory is the process's
own (no allocator, cache or heap state of an earlier case), and a case that crashes or overruns its
timeout is lost alone. Two ways there, the same record back:

- a new interpreter, ``python -m nystrom_lab.bench.harness TARGET CASE_JSON`` (:func:`main`), seconds of
  imports a case;
- a process forked from one worker that imported the target once
  (:class:`~nystrom_lab.bench.forkserver.CaseServer`), as a fresh process after its imports.

A failed case comes back as ``{"error": "<the last lines of its stderr>"}``; one past its timeout raises
``subprocess.TimeoutExpired``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from nystrom_lab.bench.forkserver import CaseServer, resolve
from nystrom_lab.bench.measure import CHILD_ENV


def run_case(
    target: str,
    case: dict,
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    server: CaseServer | None = None,
) -> dict:
    """The record of ``target(case)`` run in a fresh process: forked by ``server`` (which was started for
    ``target``), or else in a new interpreter with ``env`` added to this process's environment."""
    if server is not None:
        return server.run(case, timeout_s=timeout_s)
    return run_child("nystrom_lab.bench.harness", [target, json.dumps(case)], timeout_s=timeout_s, env=env)


def run_child(module: str, args: list[str], *, timeout_s: float, env: dict[str, str] | None = None) -> dict:
    """Run ``python -m module args`` in a fresh process (``env`` added to this one's); its last stdout line
    is a JSON dict."""
    env = {**os.environ, **CHILD_ENV, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=timeout_s
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        return {"error": " | ".join(tail) or f"exit code {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> dict:
    """``python -m nystrom_lab.bench.harness TARGET CASE_JSON``: measure the case here, print its record as
    the last stdout line, and return it."""
    target, case = argv
    record = resolve(target)(json.loads(case))
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
