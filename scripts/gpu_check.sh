#!/usr/bin/env bash
# The first GPU checks as one script (superseded by scripts/gpu_bench.sh), for a lent GPU machine (its
# python3 holds a CUDA torch and transformers; nothing is installed: the package runs from src/). Writes
# everything to $OUT:
#   gpu_tests.txt (pytest -m gpu), env.txt, table1_*.csv (attention modules on the GPU), lra_*.json(l)
# and gpu_results.tar.gz (all of it). Usage: OUT=/tmp/gpu bash scripts/gpu_check.sh [quick]
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
R=$(mktemp -d)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

echo "== pytest -m gpu"
timeout 150 $PY -m pytest -q -m gpu tests/ops/test_cuda_kernels.py tests/lab/training/test_cuda_training.py -p no:cacheprovider -rA 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"

echo "== attention modules on the GPU (b=1, h=8, d=64, m=64)"
LENGTHS=4096,16384,65536,131072
[ "${1:-}" = quick ] && LENGTHS=4096,16384
for run in "bfloat16 fwd" "bfloat16 fwdbwd" "float16 fwd" "float32 fwd"; do
  set -- $run
  extra=(); [ "$2" = fwdbwd ] && extra=(--backward)
  timeout 75 $PY -m nystrom_lab.cli bench table1 --device cuda --dtype "$1" "${extra[@]}" --heads 8 --dim-head 64 \
    --lengths $LENGTHS --methods sdpa,nystrom-64,transformer --max-n 131072 --max-exact-n 131072 \
    --repeats 10 --budget 5 --no-markdown --out "$R/table1-$1-$2" 2>&1 | grep -v "it/s\]" | tail -15
  cp "$R/table1-$1-$2/"table1_*.csv "$OUT/table1_$1_$2.csv" 2>/dev/null
done

echo "== end to end: nystrom lra listops --preset quick --device cuda --precision bf16"
timeout 100 $PY -m nystrom_lab.cli lra listops --preset quick --device cuda --precision bf16 --out "$R/lra" --no-progress 2>&1 | tail -8
cp "$R/lra/results.json" "$OUT/lra_results.json" 2>/dev/null
echo "GPUs: $($PY -c 'import torch; print(torch.cuda.device_count())') (a two-process torchrun run needs 2)"
tar czf "$OUT/gpu_results.tar.gz" -C "$R" . 2>/dev/null
ls -la "$OUT"
