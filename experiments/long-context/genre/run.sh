#!/usr/bin/env bash
# Brown genre classification (issue #25, item 5): whole documents with the continued nystrom-4096 model
# against the first 512 tokens with window-512's model (and nystrom-4096 cut at 512, to separate the
# length from the model). Same data, batch, learning rate, epochs and seed for each; a finished run is
# skipped, an interrupted one resumes from OUT/last. Needs `nystrom pretrain long-context` done and
# `nystrom data brown data/brown --genres`.
set -euo pipefail
cd "$(dirname "$0")/../../.."
EXP=experiments/long-context
G=data/brown/genres
SEEDS=${SEEDS:-0}
run() {  # name model max_length seed
  local out=$EXP/genre/$1-seed$4
  if [ -f "$out/finetune_results.json" ]; then echo "done: $out"; return; fi
  .venv/bin/nystrom finetune --init-from "$2" --max-length "$3" --seed "$4" \
    --train-file $G/train.csv --validation-file $G/validation.csv --test-file $G/test.csv \
    --batch-size 8 --lr 5e-5 --epochs 3 --precision bf16 --device cpu --no-progress --out "$out"
}
for seed in $SEEDS; do
  run window-512 $EXP/window-512 512 "$seed"
  run nystrom-4096 $EXP/nystrom-4096 4096 "$seed"
  run nystrom-4096-first512 $EXP/nystrom-4096 512 "$seed"
done
