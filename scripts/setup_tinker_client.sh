#!/usr/bin/env bash
# Create .venv-tinker: a Tinker *client* environment (the tinker SDK and the tinker-cookbook),
# the way the cookbook's users run its loops against a Tinker server. tests/tinker/test_cookbook.py
# and examples/tinker/ run with it against `traingym tinker`.
# Usage: bash scripts/setup_tinker_client.sh   (idempotent; reuses a working .venv-tinker)
#   Skip: TRAINGYM_SKIP_TINKER_CLIENT=1 (the cookbook tests then skip locally, fail under CI)
# The math-rl extra (sympy, pylatexenc, math-verify): recipes/rl_loop.py imports its grader.
# Its own venv because tinker-cookbook 0.5.8 pins transformers<=5.5.4, against traingym's
# transformers>=5.20 (0.6.1 needs tml-renderers>=0.4.1, which the registry lacks). traingym itself
# is never installed here: the client talks to the server over HTTP only.
# A failed step stops setup and names the command that failed.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "setup_tinker_client.sh: failed (exit $?): $BASH_COMMAND" >&2' ERR
if [ "${TRAINGYM_SKIP_TINKER_CLIENT:-}" = 1 ]; then
  echo "setup_tinker_client.sh: skipped (TRAINGYM_SKIP_TINKER_CLIENT=1)"; exit 0
fi
PY=${PYTHON:-python3}
VENV=.venv-tinker
# torch is pinned: an unpinned torch resolves to a multi-GB CUDA build.
REQS=("tinker-cookbook[math-rl]==0.5.8" "tinker>=0.38,<0.39" "torch==2.13.0")
SPEC="${REQS[*]}"
check() {
  "$VENV/bin/python" -c "import tinker, tinker_cookbook, torch, transformers, datasets
from tinker_cookbook.recipes import sl_loop, rl_loop
print('tinker', tinker.__version__, 'tinker-cookbook', tinker_cookbook.__version__,
      'torch', torch.__version__, 'transformers', transformers.__version__)"
}
if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.traingym-spec" ] \
   && [ "$(cat "$VENV/.traingym-spec")" = "$SPEC" ] && check >/dev/null 2>&1; then
  exit 0  # already installed with this spec
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip's notes about this machine's absent local indexes are dropped; its exit status is kept.
pip_install() {
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" || true; } \
    || { echo "setup_tinker_client.sh: failed: pip install $*" >&2; return 1; }
}
pip_install "${REQS[@]}"
check || { echo "setup_tinker_client.sh: failed: $VENV/bin/python cannot import the cookbook (see above)" >&2; exit 1; }
echo "$SPEC" > "$VENV/.traingym-spec"
