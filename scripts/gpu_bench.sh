#!/usr/bin/env bash
# Issue #36's GPU run, time-boxed to ≤ 8 minutes of wall time on an H100 (item 4): one command, every table.
# On a lent GPU machine (its python3 has a CUDA torch and transformers; no network; nothing installed):
#   bash scripts/gpu_bench.sh            # writes /tmp/gpu-bench (OUT=... to change); `quick`: 4K/16K only
#   bash scripts/gpu_bench_commit.sh /tmp/gpu-bench   # copies the files into docs/gpu/, re-renders the docs
# (the second command runs wherever the files are, e.g. here after they came back from the device).
# Stages (seconds: each stage's own deadline, its `timeout` 10 s more; a stage that fails or overruns is
# logged in $OUT/stages.log and the next one runs; no deadline passes END=465 s from the start):
#   env 10 | gpu tests 70 | launches 40 | table bf16 fwd 55 | bf16 fwdbwd 60 | fp16 fwd 30 | fp32 fwd 35
#   | models: the rest, ≥ 165 (eager + CUDA graph in half of it, torch.compile in what is left)
# Outputs (docs/gpu/ names): env.txt, gpu_tests.txt, launches_gpu.json, table1_{bfloat16_fwd,bfloat16_fwdbwd,
# float16_fwd,float32_fwd}.{csv,json}, bench_models_gpu.json, bench_models_gpu_graphed.json (+ .md), stages.log.
# DRY=1 (or --dry-run): the same Python stages on the CPU at tiny sizes (n ≤ 256, one call), outputs marked DRY.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-bench}
QUICK=(); DRYARG=()
for a in "$@"; do
  case "$a" in
    quick) QUICK=(--quick) ;;
    --dry-run|dry) DRY=1 ;;
  esac
done
[ "${DRY:-0}" = 1 ] && DRYARG=(--dry) && OUT=${OUT%/}-dry
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG="$OUT/stages.log"
: > "$LOG"
T0=$SECONDS

END=${END:-465}  # seconds: no stage's deadline passes it; the models stage gets what the others left

stage() {  # stage NAME BUDGET STAGE [ARGS...]: its deadline (≤ what is left), a timeout 10 s past it, logged
  local name=$1 budget=$2 what=$3; shift 3
  local t=$SECONDS left=$((END - (SECONDS - T0)))
  [ "$budget" = rest ] && budget=$left
  [ "$budget" -gt "$left" ] && budget=$left
  if [ "$budget" -lt 5 ]; then echo "$name skipped: out of time" | tee -a "$LOG"; return; fi
  echo "== $name (budget ${budget} s, at $((SECONDS - T0)) s)"
  timeout -k 5 $((budget + 10)) $PY -m nystrom_lab.bench.gpu_bench "$what" "$OUT" "$@" --budget "$budget" \
    "${QUICK[@]}" "${DRYARG[@]}" 2>&1 | grep -v "it/s\]" | tail -40
  local rc=${PIPESTATUS[0]}
  echo "$name rc=$rc $((SECONDS - t)) s" | tee -a "$LOG"
}

stage env 10 env
stage "gpu tests" 70 tests
stage launches 40 launches
stage "table bf16 fwd" 55 table bfloat16 fwd
stage "table bf16 fwdbwd" 60 table bfloat16 fwdbwd
stage "table fp16 fwd" 30 table float16 fwd
stage "table fp32 fwd" 35 table float32 fwd
stage models rest models
echo "total $((SECONDS - T0)) s" | tee -a "$LOG"
ls -la "$OUT"
