#!/usr/bin/env bash
# Whole long-document models on a lent GPU (superseded by scripts/gpu_bench.sh's models stage): `nystrom bench
# models` cases in bf16 on CUDA at 4K and 16K tokens, one round; writes $OUT/bench_models_gpu.{json,md}.
# Usage: OUT=/tmp/x bash scripts/gpu_models.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-models}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 - "$OUT" <<'PY'
import sys
from pathlib import Path
from nystrom_lab.bench.models.cases import MODELS, MODES
from nystrom_lab.bench.models.driver import run
report = run(size="minilm", lengths=(4096, 16384), models=MODELS, modes=MODES, rounds=1, repeats=3, dtype="bf16",
             device="cuda", timeout_s=90, out_dir=Path(sys.argv[1]), name="bench_models_gpu", progress=False)
print((Path(sys.argv[1]) / "bench_models_gpu.md").read_text())
PY
