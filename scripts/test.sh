#!/usr/bin/env bash
# Run the test suite (fast by default; pass -m slow for the long end-to-end runs) on every core, at most 8:
# one pytest-xdist worker per core, each with its share of torch's threads (tests/conftest.py), and idle
# workers take queued tests from busy ones (worksteal). Extra arguments go to pytest and come last, so they
# win: -n 0 runs the suite in this process (a debugger, -x, --pdb), -n 4 on four workers.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" test
cd "$ROOT"
WORKERS="$(nproc)"
WORKERS=$((WORKERS > 8 ? 8 : WORKERS))
exec .venv/bin/python -m pytest -q -n "$WORKERS" --dist worksteal "$@"
