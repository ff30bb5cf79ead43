#!/usr/bin/env bash
# Debian's Chromium for the dashboard's browser tests (tests/dashboard/test_browser.py), which
# drive it with Playwright's Python package (the `test` extra) and never download a browser.
# Usage: bash scripts/setup_browser.sh   (idempotent; called by scripts/setup.sh)
# Installs `chromium` with apt-get when /usr/bin/chromium is missing and we are root (CI runs as
# root on a clean machine); otherwise prints what to run and exits 0 (the tests then skip
# locally, and fail under CI=true). TRAINGYM_SKIP_BROWSER=1 skips this step.
set -euo pipefail
CHROMIUM=${TRAINGYM_CHROMIUM:-/usr/bin/chromium}
if [ "${TRAINGYM_SKIP_BROWSER:-0}" = "1" ]; then
  echo "setup_browser.sh: skipped (TRAINGYM_SKIP_BROWSER=1); the browser tests will skip"
  exit 0
fi
if [ -x "$CHROMIUM" ]; then
  echo "setup_browser.sh: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM") present"
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "setup_browser.sh: installing Debian's chromium (apt-get) for the dashboard's browser tests"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || { echo "setup_browser.sh: failed: apt-get update" >&2; exit 1; }
  apt-get install -y -q chromium >/dev/null \
    || { echo "setup_browser.sh: failed: apt-get install chromium" >&2; exit 1; }
  "$CHROMIUM" --version
else
  echo "setup_browser.sh: no Chromium at $CHROMIUM and cannot install it here (needs root and" \
       "apt-get); install it with: sudo apt-get install chromium (or set TRAINGYM_CHROMIUM to a" \
       "Chromium binary). Until then the dashboard's browser tests skip (and fail under CI=true)."
fi
