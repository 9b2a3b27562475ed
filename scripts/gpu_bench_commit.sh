#!/usr/bin/env bash
# After scripts/gpu_bench.sh: copy its files from OUT (default /tmp/gpu-bench) into docs/gpu/ and re-render
# the docs (`nystrom docs render`). A table with cases cut by the time budget is left out unless --force;
# a dry run's folder is refused. Then review `git diff docs/` and commit. The fused stage's files come too
# (docs/gpu/fused_*.json, fused_summary.md), fused_tuning.json among them: the sweep's chosen launch
# configuration. No entry point turns it into the launch defaults yet (fused/configs.py is generated from
# docs/gpu/kernel_resources.json by `python -m nystrom_lab.bench.gpu.kernel_resources --write`, which
# reads no timings): the TODO in docs/fused_kernels.md ("Targets") says how; call that entry point here
# once it reads fused_tuning.json.
#   Usage: bash scripts/gpu_bench_commit.sh [OUT] [--force]
set -euo pipefail
OUT=${1:-/tmp/gpu-bench}
shift || true
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
${PYTHON:-python3} -m nystrom_lab.bench.gpu.driver commit "$OUT" "$@"
