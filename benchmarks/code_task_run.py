"""The code-task RL run of BENCHMARKS.md ("Code-task RL on the embedded model"), recorded.

Runs `examples/code_task.py` (embedded SmolLM2-135M, 8 prompts x 4 samples, 40 new tokens,
graded in a sandbox against hidden tests; 20 training problems, 8 held-out) in a fresh process
with its own run directory, then writes what the run directory holds to a new result file
(benchmarks/resultfile.py): the training reward and seconds of every step (events.jsonl), the
held-out evaluation before and after (results.json), the wall time; its `provenance` has the
commit (and whether the tree had uncommitted changes) and the load average before and after
(the machine is shared: step times move with the load).

    PYTHONPATH=src .venv/bin/python benchmarks/code_task_run.py --steps 8     # minutes
        # -> benchmarks/results/code_task_run/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/code_task_run.py --tiny --backend process \\
        --out /tmp/code_task_run_smoke.json                                   # smoke, seconds

Not covered: more than one seed; with 8 held-out problems the evaluation is far too small to
claim an improvement (its standard errors say so).
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

ROOT = Path(__file__).resolve().parent.parent


def commit() -> dict:
    """The commit of the checkout this script runs from, and whether it had local changes
    (the result file's provenance has them as of the end of the run; this, when called)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.strip()
    return {"commit": head, "uncommitted_changes": bool(dirty)}


def main() -> None:
    from traingym.observability.events import read_events

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--backend", default="bwrap", help="sandbox backend (bwrap or process)")
    ap.add_argument("--tiny", action="store_true", help="the example's tiny model: smoke only")
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("code_task_run", args)
    shown = ["python", "examples/code_task.py", "--steps", str(args.steps), "--backend",
             args.backend, *(["--tiny"] if args.tiny else [])]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, str(ROOT / shown[1]), *shown[2:], "--run-dir", str(run_dir)]
        t0 = time.monotonic()
        subprocess.run(cmd, check=True)
        wall = time.monotonic() - t0
        events = read_events(run_dir)
        results = json.loads((run_dir / "results.json").read_text())
    out = {"command": " ".join(shown),
           "date": time.strftime("%Y-%m-%d"), "tiny": args.tiny,
           "backend": args.backend, "wall_s": wall,
           "reward_mean_per_step": [e["reward_mean"] for e in events],
           "seconds_step": [e["seconds_step"] for e in events], "eval": results["eval"]}
    path = rec.write(out)
    for mode, d in results["eval"].get("delta", {}).items():
        print(f"held-out {mode}: {d['delta']:+.3f} ± {d['se']:.3f}")
    print(f"{len(events)} steps in {wall:.0f} s; wrote {path}")


if __name__ == "__main__":
    main()
