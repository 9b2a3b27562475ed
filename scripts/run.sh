#!/usr/bin/env bash
# The main job on its built-in default (no data to fetch). Extra arguments go to `nystrom demo`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" run
cd "$ROOT"
exec .venv/bin/nystrom demo "$@"
