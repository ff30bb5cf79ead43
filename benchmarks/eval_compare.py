"""`traingym eval --compare base CHECKPOINT` against the run's own before/after figure.

    .venv/bin/python benchmarks/eval_compare.py RUN_DIR [--out benchmarks/results/eval_compare.json]

Runs the CLI on the run's base model and its latest committed checkpoint (the run's own eval
config, rows and seed), then writes the comparison, the run's results.json eval report, whether
each metric's mean, SE and paired delta are equal (exactly, and the largest absolute
difference), the wall time, the commit and the machine's load to the result file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/eval_compare.json"))
    ap.add_argument("--commit", help="the commit the code under test is from (default: HEAD; "
                    "give it when running a snapshot through PYTHONPATH)")
    args = ap.parse_args()
    run = Path(args.run_dir).resolve()
    from traingym.runs.checkpoint import committed

    ckpt = committed(run / "checkpoints")[-1]
    report = json.loads((run / "results.json").read_text())["eval"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cmp"
        t0 = time.monotonic()
        load0 = os.getloadavg()
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
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                                           capture_output=True, text=True).stdout.strip()
    result = {"run_dir": str(run), "checkpoint": str(ckpt),
              "run_config": {k: json.loads((run / "config.json").read_text())[k]
                             for k in ("steps", "model", "eval", "seed")},
              "run_eval": report, "compare": cmp, "match": checks,
              "eval_compare_seconds": seconds, "load_before": load0, "load_after": os.getloadavg(),
              "commit": commit, "cpus": os.cpu_count()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(checks), f"{seconds:.0f} s", "->", args.out)


if __name__ == "__main__":
    main()
