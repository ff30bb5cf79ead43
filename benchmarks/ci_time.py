"""Time CI as CI runs it: a fresh clone of HEAD, `CI=true bash .ci/run`, and what pytest reported.

Writes benchmarks/results/ci_time/2026-12-03-647e521.json: commit, date, load average before and after, wall time of
the whole run (setup included) and of pytest alone, passed / failed / skipped counts, each skip's
reason, the slowest tests (`.ci/run` prints 25), and the exit code. README.md quotes it.

    .venv/bin/python benchmarks/ci_time.py            # about 20 min on 2 cores

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
from pathlib import Path

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
    counts["slowest"] = re.findall(r"^([\d.]+s (?:call|setup|teardown)\s+\S+)$", log, re.M)
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/ci_time/2026-12-03-647e521.json"))
    args = ap.parse_args()
    pip_cache = Path.home() / ".cache/pip"
    with tempfile.TemporaryDirectory(prefix="traingym-ci-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        load_before = os.getloadavg()
        t0 = time.monotonic()
        p = subprocess.run(["bash", ".ci/run"], cwd=clone, env={**os.environ, "CI": "true"},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True)
        wall = time.monotonic() - t0
        log = p.stdout + p.stderr
    result = {
        "commit": git("rev-parse", "HEAD"),
        "uncommitted_changes_not_included": bool(git("status", "--porcelain")),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpus": os.cpu_count(),
        "load_before": load_before, "load_after": os.getloadavg(),
        "pip_cache_mb": (sum(f.stat().st_size for f in pip_cache.rglob("*") if f.is_file())
                         / 1e6 if pip_cache.is_dir() else 0.0),
        "exit_code": p.returncode,
        "wall_s": round(wall, 1),
        **summary(log),
        "log_tail": log[-3000:],
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("log_tail", "slowest")},
                     indent=1))
    return 0 if p.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
