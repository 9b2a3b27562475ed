#!/usr/bin/env bash
# Run the test suite (fast by default; pass -m slow for the long end-to-end runs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" test
cd "$ROOT"
exec .venv/bin/python -m pytest -q "$@"
