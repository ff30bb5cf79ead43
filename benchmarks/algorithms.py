"""Held-out reward of the embedded default run under each algorithm (issue 13, acceptance 2).

For each algorithm in --algorithms (default grpo, dapo, gspo, rloo), runs the embedded
default config (`traingym.train(build_config(overrides={"algorithm": {"name": ...}}))`, the
same seed, --steps steps; evaluation before and after on the default 128 held-out prompts)
and writes a new result file (benchmarks/resultfile.py), per algorithm: the held-out
figures before/after/paired delta as the run's results.json holds them (sampled and greedy,
mean and standard error), the reward per step, groups kept, DAPO's sample_rounds, wall
seconds; and `provenance` (the commit, read before the first run; the load average before and
after; the command line, ...).

    PYTHONPATH=src .venv/bin/python benchmarks/algorithms.py   # -> benchmarks/results/algorithms/
    PYTHONPATH=src .venv/bin/python benchmarks/algorithms.py --model tiny --steps 2 \\
        --out /tmp/algorithms_smoke.json                                   # smoke, a minute

The default run takes about 5 minutes per algorithm on the quiet 2-core machine (194 s of loop
in benchmarks/results/default_run/2026-12-02-1784c2a.json, plus the two evaluations). After
every algorithm the runs finished so far (with provenance) are rewritten to `<result>.partial`
beside the result file's name as known at the start, so an interrupted sweep keeps them (rename
it to .json to keep it); the result file itself is written once, at the end, and the .partial
removed. Not covered: more than one seed per algorithm.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import resultfile


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
    resultfile.add_args(p)
    a = p.parse_args()
    rec = resultfile.start("algorithms", a)  # the commit and load average: before the first run
    # Progress after every algorithm: <result>.partial, the finished runs plus provenance so far.
    partial = Path(f"{a.out or resultfile.new_path('algorithms', a.label, rec.started)}.partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    out = {"runs": []}
    with tempfile.TemporaryDirectory(prefix="algorithms-") as tmp:
        for name in a.algorithms.split(","):
            out["runs"].append(run_one(name, a, Path(tmp)))
            r = out["runs"][-1]
            delta = r["eval"].get("delta", {}).get(r["eval"].get("target_metric", ""), {})
            print(f"{name}: held-out delta {delta} in {r['wall_s']:.0f} s", flush=True)
            so_far = {**out, "provenance": resultfile.provenance(rec.started, rec.load_before,
                                                                 rec.commit)}
            partial.write_text(json.dumps(so_far, indent=1, default=str))
    rec.write(out)
    partial.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
