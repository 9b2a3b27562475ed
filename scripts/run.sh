#!/usr/bin/env bash
# The main job on its built-in default: the paper's LRA model on generated ListOps, quick preset
# (a few minutes on a 2-core CPU; no data to fetch). Extra arguments go to `nystrom lra listops`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" run
cd "$ROOT"
exec .venv/bin/nystrom lra listops --preset quick --out runs/listops-quick "$@"
