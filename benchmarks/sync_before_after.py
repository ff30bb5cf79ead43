"""The weight sync in the loop before and after a change, side by side (issue 17 acceptance 4).

Runs benchmarks/loop_sync.py (the embedded default, colocated, per transport) and
benchmarks/async_utilization.py (the async workload) from two source trees: this checkout
("after") and a git worktree of --before ("before"), alternating before/after per item so a
slow phase of the shared machine falls on both. Each run is a fresh process with
PYTHONPATH=<tree>/src and that tree's own copy of the benchmark script; the same venv.
Each run writes its result to a temporary file (`--out`), read back here; this writes every
run's result file, nested (with its own `provenance` where that tree's script records one),
plus a summary (loop: median sync seconds per codec and transport; async: samples/s and
trainer idle per configuration) to a new result file with its provenance
(benchmarks/resultfile.py).

    PYTHONPATH=src .venv/bin/python benchmarks/sync_before_after.py          # ~30 min here
        # -> benchmarks/results/sync_before_after/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/sync_before_after.py --preset tiny --steps 2 \\
        --transports inproc --async-steps 6 --out /tmp/sba_smoke.json      # smoke

Default --before: ee11751, the last commit before the issue-17 weight-sync work (937faea:
incremental hash, sharded coding; then the fused cast, the colocated zero-copy apply and the
chain that forgets its frames).
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

import resultfile

ROOT = Path(__file__).resolve().parents[1]


def rev(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def run(tree: Path, script: str, args: list[str], out: Path, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, str(tree / "benchmarks" / script), *args, "--out", str(out)]
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    res = json.loads(out.read_text())
    res["driver"] = {"tree_commit": rev(tree), "wall_s": time.time() - t0,
                     "loadavg_after": os.getloadavg(), "command": cmd}
    return res


def loop_summary(res: dict) -> dict:
    return {"median_sync_s": res["median_sync_s"],
            "full_over_delta_sync_time": res["full_over_delta_sync_time"],
            "codecs_sent": sorted({e["sync_codec"] for r in res["runs"] for e in r["events"]})}


def async_summary(res: dict) -> dict:
    return {name: {k: s[k] for k in ("samples_per_s", "trainer_idle_frac") if k in s}
            for name, s in res["summary"].items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", default="ee11751")
    p.add_argument("--preset", default="default")
    p.add_argument("--steps", type=int, default=3, help="loop steps per run")
    p.add_argument("--transports", default="inproc,tcp")
    p.add_argument("--codecs", default="delta,full,auto")
    p.add_argument("--async-steps", type=int, default=30)
    p.add_argument("--async-seeds", default="0")
    p.add_argument("--skip-async", action="store_true")
    resultfile.add_args(p)
    a = p.parse_args()
    rec = resultfile.start("sync_before_after", a)
    result = {"args": vars(a),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loop": {}, "async": {}}
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before),
                        a.before], check=True, capture_output=True)
        trees = {"before": before, "after": ROOT}
        try:
            for transport in a.transports.split(","):
                item = result["loop"][transport] = {}
                for side, tree in trees.items():
                    res = run(tree, "loop_sync.py",
                              ["--preset", a.preset, "--set", f"steps={a.steps}",
                               "--transport", transport, "--codecs", a.codecs],
                              Path(tmp) / f"loop-{transport}-{side}.json", threads=2)
                    item[side] = {"summary": loop_summary(res), "result": res}
                    print(side, transport, item[side]["summary"], flush=True)
            if not a.skip_async:
                for side, tree in trees.items():
                    seeds = a.async_seeds.split(",")
                    res = run(tree, "async_utilization.py",
                              ["--steps", str(a.async_steps), "--seeds", *seeds],
                              Path(tmp) / f"async-{side}.json", threads=1)
                    result["async"][side] = {"summary": async_summary(res), "result": res}
                    print(side, "async", result["async"][side]["summary"], flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], capture_output=True)
    rec.write(result)


if __name__ == "__main__":
    main()
