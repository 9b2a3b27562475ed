#!/usr/bin/env bash
# The main job on its built-in default: `nystrom lra listops --preset quick`, the paper's LRA model (Nyström-64)
# trained and tested on generated ListOps with the quick preset, into runs/listops-quick (a few minutes on a
# 2-core CPU; no data to fetch). Extra arguments go to `nystrom lra listops`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" run
cd "$ROOT"
exec .venv/bin/nystrom lra listops --preset quick --out runs/listops-quick "$@"
