"""`traingym eval --compare base CHECKPOINT` against the run's own before/after figure.

    .venv/bin/python benchmarks/eval_compare.py RUN_DIR [--label embedded]
        # -> benchmarks/results/eval_compare/<date>-<commit>[-embedded].json
    .venv/bin/python benchmarks/eval_compare.py RUN_DIR --out /tmp/eval_compare.json   # a check

Runs the CLI on the run's base model and its latest committed checkpoint (the run's own eval
config, rows and seed), then writes the comparison, the run's results.json eval report, whether
each metric's mean, SE and paired delta are equal (exactly, and the largest absolute
difference) and the wall time to a new result file; its provenance (benchmarks/resultfile.py)
has the commit and the machine's load. With --commit (code under test from a snapshot on
PYTHONPATH, not this checkout) the file also holds `commit_under_test`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import resultfile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    resultfile.add_args(ap)
    ap.add_argument("--commit", help="the commit the code under test is from (default: HEAD, "
                    "provenance's; give it when running a snapshot through PYTHONPATH)")
    args = ap.parse_args()
    rec = resultfile.start("eval_compare", args)
    run = Path(args.run_dir).resolve()
    from traingym.runs.checkpoint import committed

    ckpt = committed(run / "checkpoints")[-1]
    report = json.loads((run / "results.json").read_text())["eval"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cmp"
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "traingym.cli", "eval", "--compare", "base",
                        str(ckpt), "--out", str(out)], check=True)
        seconds = time.monotonic() - t0
        cmp = json.loads((out / "compare.json").read_text())
    checks = {}
    for metric, d in report.get("delta", {}).items():
        pairs = [(cmp["delta"][metric][k], d[k]) for k in ("delta", "se")]
        pairs += [(cmp["a_scores"][metric][k], report["before"][metric][k]) for k in ("mean", "se")]
        pairs += [(cmp["b_scores"][metric][k], report["after"][metric][k]) for k in ("mean", "se")]
        checks[metric] = {"equal": all(x == y for x, y in pairs),
                          "max_abs_diff": max(abs(x - y) for x, y in pairs)}
    result = {"run_dir": str(run), "checkpoint": str(ckpt),
              "run_config": {k: json.loads((run / "config.json").read_text())[k]
                             for k in ("steps", "model", "eval", "seed")},
              "run_eval": report, "compare": cmp, "match": checks,
              "eval_compare_seconds": seconds}
    if args.commit:
        result["commit_under_test"] = args.commit
    print(json.dumps(checks), f"{seconds:.0f} s")
    rec.write(result)


if __name__ == "__main__":
    main()
