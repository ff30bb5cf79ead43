"""Time CI as CI runs it: a fresh clone of HEAD, `CI=true bash .ci/run`, and what pytest reported.

Writes a new file under benchmarks/results/ci_time/: wall time of the whole run (setup included)
and of pytest alone, passed / failed / skipped counts, each skip's reason, how many tests passed
in each test file (`PYTEST_ADDOPTS=-rA` makes the same command list every outcome), the slowest
tests (`.ci/run` prints 25), and the exit code, with the provenance resultfile.py records.
README.md quotes it.

    .venv/bin/python benchmarks/ci_time.py            # about 25 min on 2 cores

Limits: the clone has only committed files (uncommitted changes are flagged, not included);
pip installs from whatever cache and local wheels the machine has (recorded: the pip cache size).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import resultfile

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


def summary(log: str) -> dict:
    """pytest's last summary line and its short test summary (skips, failures)."""
    counts = {}
    final = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|errors?).*) in ([\d.]+)s", log, re.M)
    if final:
        line, seconds = final[-1]
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", line):
            counts[what] = int(n)
        counts["pytest_s"] = float(seconds)
    counts["skips"] = re.findall(r"^SKIPPED \[\d+\] (.*)$", log, re.M)
    counts["failures"] = re.findall(r"^(?:FAILED|ERROR) (.*)$", log, re.M)
    passed = Counter(m.split("::")[0] for m in re.findall(r"^PASSED (\S+)", log, re.M))
    counts["passed_by_file"] = dict(sorted(passed.items()))
    counts["slowest"] = re.findall(r"^([\d.]+s (?:call|setup|teardown)\s+\S+)$", log, re.M)
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("ci_time", args)
    pip_cache = Path.home() / ".cache/pip"
    with tempfile.TemporaryDirectory(prefix="traingym-ci-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        t0 = time.monotonic()
        p = subprocess.run(["bash", ".ci/run"], cwd=clone, stdin=subprocess.DEVNULL,
                           env={**{k: v for k, v in os.environ.items()
                                   if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
                                "CI": "true", "PYTEST_ADDOPTS": "-rA"},
                           capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        log = p.stdout + p.stderr
    result = {
        "uncommitted_changes_not_included": bool(git("status", "--porcelain",
                                                     "--untracked-files=no")),
        "pip_cache_mb": (sum(f.stat().st_size for f in pip_cache.rglob("*") if f.is_file())
                         / 1e6 if pip_cache.is_dir() else 0.0),
        "exit_code": p.returncode,
        "wall_s": round(wall, 1),
        **summary(log),
        "log_tail": log[-3000:],
    }
    rec.write(result)
    print(json.dumps({k: v for k, v in result.items()
                      if k not in ("log_tail", "slowest", "passed_by_file")}, indent=1))
    return 0 if p.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
