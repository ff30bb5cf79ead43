"""Held-out reward of the embedded default run under each algorithm (issue 13, acceptance 2).

For each algorithm in --algorithms (default grpo, dapo, gspo, rloo), runs the embedded
default config (`traingym.train(build_config(overrides={"algorithm": {"name": ...}}))`, the
same seed, --steps steps; evaluation before and after on the default 128 held-out prompts)
and writes to --out (default benchmarks/results/algorithms/2026-12-03-f96391c.json), per algorithm: the held-out
figures before/after/paired delta as the run's results.json holds them (sampled and greedy,
mean and standard error), the reward per step, groups kept, DAPO's sample_rounds, wall
seconds; and the commit (read before the first run: the checkout is shared), the load
average before and after, the command line.

    PYTHONPATH=src .venv/bin/python benchmarks/algorithms.py              # the full default
    PYTHONPATH=src .venv/bin/python benchmarks/algorithms.py --model tiny --steps 2 \\
        --out /tmp/algorithms_smoke.json                                   # smoke, a minute

The default run takes about 5 minutes per algorithm on the quiet 2-core machine (194 s of loop
in benchmarks/results/default_run/2026-12-02-1784c2a.json, plus the two evaluations); the result file is rewritten
after every algorithm, so an interrupted sweep keeps the runs it finished. Not covered: more
than one seed per algorithm.
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


def run_one(name: str, a, work: Path) -> dict:
    import traingym
    from traingym.observability.events import read_events

    over = {"seed": a.seed, "algorithm": {"name": name}}
    if a.steps:
        over["steps"] = a.steps
    if a.model != "embedded":
        over["model"] = {"path": a.model}
        over["eval"] = {"num_prompts": 16}
    cfg = traingym.build_config("tiny" if a.model == "tiny" else "default", overrides=over)
    t0 = time.monotonic()
    res = traingym.train(cfg, run_dir=work / name, progress=False)
    wall = time.monotonic() - t0
    events = read_events(work / name)
    return {"algorithm": name, "steps": cfg.steps, "wall_s": wall, "eval": res.eval,
            "reward_per_step": [e["reward_mean"] for e in events],
            "groups_kept": [e["groups_kept"] for e in events],
            "sample_rounds": [e.get("sample_rounds") for e in events]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algorithms", default="grpo,dapo,gspo,rloo")
    p.add_argument("--model", default="embedded", help="'embedded' (the default run) or 'tiny'")
    p.add_argument("--steps", type=int, default=0, help="0: the default config's steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/algorithms/2026-12-03-f96391c.json"))
    a = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out = {"commit": commit, "argv": sys.argv, "load_before": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="algorithms-") as tmp:
        for name in a.algorithms.split(","):
            out["runs"].append(run_one(name, a, Path(tmp)))
            r = out["runs"][-1]
            delta = r["eval"].get("delta", {}).get(r["eval"].get("target_metric", ""), {})
            print(f"{name}: held-out delta {delta} in {r['wall_s']:.0f} s", flush=True)
            out["load_after"] = os.getloadavg()
            Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
