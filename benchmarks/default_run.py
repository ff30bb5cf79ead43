"""The main job as a user runs it, timed end to end with where the time went: `traingym train`
(no config: the embedded model on the default task, with its evaluations before and after).

Runs this checkout's `.venv/bin/traingym train --run-dir <tmp>` and records: the wall time of
the whole command (start-up and both evaluations included), the training loop alone
(`elapsed_s`), the time in each traced phase summed over the run (`eval`, `generate`,
`train_step` with `forward`/`backward`/`optimizer`, the weight sync's `publish`, `checkpoint`:
from the run's trace.json), the per-step medians from events.jsonl (rollout, train, sync, step,
the trainer's wait on rollouts), the dtypes `auto` chose, and the run's held-out results.

`--isa avx2` restricts torch, oneDNN and MKL to AVX2 (`ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`): torch then reports no bf16 kernels and
`auto` picks fp32, as on most laptops. It is a restriction of this CPU, not an older one (its
clock, caches and memory stay), and the result file says so (`isa`).

    .venv/bin/python benchmarks/default_run.py                  # -> results/default_run/
    .venv/bin/python benchmarks/default_run.py --isa avx2 --label avx2
    .venv/bin/python benchmarks/default_run.py --preset tiny --out /tmp/default_run_smoke.json
    .venv/bin/python benchmarks/default_run.py --isa avx2 --tree /tmp/before --label avx2-before

`--tree DIR` runs another checkout's code (a `git worktree` of an earlier commit: its `src` goes
first on PYTHONPATH, with this .venv's packages; copy the built `_native*.so` into its
`src/traingym/weights/` or the codec runs its NumPy fallback), for a before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import resultfile

ROOT = Path(__file__).resolve().parent.parent
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
PHASES = ("eval", "step", "generate", "train_step", "forward", "backward", "optimizer",
          "publish", "checkpoint", "collect")
STEP_KEYS = ("seconds_rollout", "seconds_train", "seconds_sync", "seconds_step",
             "wait_trainer_on_rollout_s", "sync_cast_s", "sync_encode_s", "sync_apply_s",
             "sync_engine_s")


def trace_phases(trace: Path) -> dict:
    """Seconds spent in each traced phase, summed over the run, and how many spans each had."""
    data = json.loads(trace.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    total, count = defaultdict(float), defaultdict(int)
    for e in events:
        if e.get("ph") == "X" and e.get("name") in PHASES:
            total[e["name"]] += e.get("dur", 0) / 1e6
            count[e["name"]] += 1
    return {name: {"s": round(total[name], 2), "spans": count[name]} for name in PHASES
            if name in total}


def probe(env: dict) -> dict:
    """What torch reports under `env`: bf16 kernels and the dtypes `auto` resolves to."""
    code = ("import json, torch; from traingym.core.precision import fast_bf16, engine_dtype;"
            "print(json.dumps({'bf16_kernels': fast_bf16(), 'capability': "
            "torch.backends.cpu.get_cpu_capability(), 'auto_engine_dtype': "
            "str(engine_dtype('auto'))}))")
    out = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", choices=("native", "avx2"), default="native")
    ap.add_argument("--preset", default=None, help="passed to `traingym train` (tiny: smoke)")
    ap.add_argument("--tree", type=Path, default=None,
                    help="run another checkout's src (a worktree of an earlier commit)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to `traingym train --set` (recorded)")
    resultfile.add_args(ap)
    args = ap.parse_args()
    if args.isa == "avx2":  # here too, so that provenance's probe of torch sees the restriction
        os.environ.update(AVX2)
    rec = resultfile.start("default_run", args)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if args.tree:
        if not (args.tree / "src/traingym/cli.py").is_file():
            sys.exit(f"default_run: --tree {args.tree} has no src/traingym/cli.py")
        env["PYTHONPATH"] = str(args.tree.resolve() / "src")
    torch_view = probe(env)
    with tempfile.TemporaryDirectory(prefix="default_run-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [str(ROOT / ".venv/bin/python"), "-m", "traingym.cli", "train", "--run-dir",
               str(run_dir)]
        cmd += ["--preset", args.preset] if args.preset else []
        for item in args.set:
            cmd += ["--set", item]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            sys.exit(f"default_run: {' '.join(cmd)} failed (exit {proc.returncode}):\n"
                     + proc.stderr[-3000:])
        events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()
                  if ln.strip()]
        results = json.loads((run_dir / "results.json").read_text())
        phases = trace_phases(run_dir / "trace.json")
        config = json.loads((run_dir / "config.json").read_text())
    medians = {k: round(statistics.median(e[k] for e in events if k in e), 3)
               for k in STEP_KEYS if any(k in e for e in events)}
    loop_s = events[-1]["elapsed_s"]
    figures = {
        "command": " ".join(["traingym", "train", *cmd[6:]]), "isa": args.isa,
        "tree": str(args.tree) if args.tree else None,
        "tree_commit": resultfile.git("-C", str(args.tree.resolve()), "rev-parse", "HEAD")
        if args.tree else None,
        "isa_env": AVX2 if args.isa == "avx2" else {}, "torch": torch_view,
        "precision": {"engine_dtype": config["model"].get("engine_dtype"),
                      "bf16_autocast": config["trainer"].get("bf16_autocast")},
        "wall_s": round(wall, 1), "wall_min": round(wall / 60, 2), "loop_s": round(loop_s, 1),
        "outside_loop_s": round(wall - loop_s, 1), "steps": len(events),
        "phases_s": phases, "step_medians_s": medians,
        "wait_trainer_on_rollout_total_s": round(sum(
            e.get("wait_trainer_on_rollout_s", 0) for e in events), 1),
        "results": results,
    }
    path = rec.write(figures)
    ev = results.get("eval", {})
    print(f"{args.isa}: whole run {wall:.0f} s ({wall / 60:.2f} min), loop {loop_s:.0f} s, "
          f"eval {phases.get('eval', {}).get('s')} s; held-out change {ev.get('delta')}; {path}")


if __name__ == "__main__":
    main()
