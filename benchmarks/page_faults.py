"""What page faults cost a training step: vs_trl.py's equal-work traingym run under three memory
settings, each in fresh processes, rounds interleaved.

    PYTHONPATH=src .venv/bin/python benchmarks/page_faults.py
        # -> benchmarks/results/page_faults/<date>-<commit>.json (benchmarks/resultfile.py)
    PYTHONPATH=src .venv/bin/python benchmarks/page_faults.py --rounds 1 --steps 3 \\
        --out /tmp/page_faults.json        # smoke

Settings (config keys; everything else is `vs_trl.traingym_overrides` with --no-drop):
- `4k-trim`: huge_pages false, trainer.trim_memory true: torch's 4 KiB pages, the heap's free
  pages given back after each rollout, pass and step (the code before 12-06's change);
- `huge-trim`: huge_pages true (torch's tensors of 2 MiB and more on transparent huge pages),
  trim_memory true: the defaults;
- `huge-keep`: huge_pages true, trim_memory false: freed pages kept for reuse, as a plain torch
  loop (TRL's) keeps them.
Per train step (the trainer's `train_step`: forward, backward, optimizer): wall seconds, the
process's CPU seconds (user + system) and system seconds, and its minor page faults, from
getrusage around the call. Per loop step: rollout + train + sync seconds from the run's
events.jsonl (as vs_trl.py counts a step). The first `--skip` steps of each process are left
out; medians over the rest of all rounds. A round runs each setting once, in a rotated order.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import resultfile

SETTINGS = {
    "4k-trim": {"huge_pages": False, "trainer": {"trim_memory": True}},
    "huge-trim": {"huge_pages": True, "trainer": {"trim_memory": True}},
    "huge-keep": {"huge_pages": True, "trainer": {"trim_memory": False}},
}


def child(setting: str, steps: int, threads: int, run_dir: Path) -> dict:
    import vs_trl

    from traingym.config.load import build_config
    from traingym.loop.build import build_run
    from traingym.loop.sync import train_loop

    a = argparse.Namespace(seed=0, steps=steps, threads=threads, no_drop=True)
    overrides = vs_trl.traingym_overrides(a)
    for key, value in SETTINGS[setting].items():
        if isinstance(value, dict):
            overrides.setdefault(key, {}).update(value)
        else:
            overrides[key] = value
    run, start = build_run(build_config(overrides=overrides), run_dir, False, progress=False)
    run.maybe_checkpoint = lambda *a, **k: False
    real = run.trainer.train_step
    rows: list[dict] = []

    def measured(batch):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = real(batch)
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        rows.append({"wall_s": wall, "sys_s": r1.ru_stime - r0.ru_stime,
                     "cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                     "minor_faults": r1.ru_minflt - r0.ru_minflt})
        return out

    run.trainer.train_step = measured
    train_loop(run, start)
    run.close()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    for row, e in zip(rows, events):
        row["loop_step_s"] = e["seconds_rollout"] + e["seconds_train"] + e["seconds_sync"]
        row["rollout_s"] = e["seconds_rollout"]
    return {"steps": rows, "peak_rss_mib": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="loop steps per process")
    ap.add_argument("--skip", type=int, default=2, help="first steps of a process left out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    resultfile.add_args(ap)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.threads, Path(args.run_dir))))
        return
    rec = resultfile.start("page_faults", args)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    env.pop("THP_MEM_ALLOC_ENABLE", None)  # each setting's config decides
    runs: dict[str, list[dict]] = {s: [] for s in args.settings}
    for r in range(args.rounds):
        order = args.settings[r % len(args.settings):] + args.settings[:r % len(args.settings)]
        for setting in order:
            with tempfile.TemporaryDirectory() as tmp:
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", setting, "--steps", str(args.steps),
                     "--threads", str(args.threads), "--run-dir", str(Path(tmp) / "run")],
                    capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                sys.exit(f"{setting}: child failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-4000:]}")
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            out["round"], out["load_1min"] = r, os.getloadavg()[0]
            runs[setting].append(out)
            kept = out["steps"][args.skip:]
            print(f"round {r} {setting:>9}: train step "
                  f"{statistics.median(s['wall_s'] for s in kept):.2f} s, faults "
                  f"{statistics.median(s['minor_faults'] for s in kept):.0f}", flush=True)
    summary = {}
    for setting, procs in runs.items():
        kept = [s for p in procs for s in p["steps"][args.skip:]]
        summary[setting] = {k: statistics.median(s[k] for s in kept) for k in kept[0]}
        summary[setting]["peak_rss_mib"] = max(p["peak_rss_mib"] for p in procs)
        summary[setting]["steps_counted"] = len(kept)
    base = summary.get("4k-trim")
    if base:
        for setting, s in summary.items():
            s["train_step_vs_4k_trim"] = base["wall_s"] / s["wall_s"]
            s["loop_step_vs_4k_trim"] = base["loop_step_s"] / s["loop_step_s"]
    for setting, s in summary.items():
        print(f"{setting:>9}: train {s['wall_s']:.2f} s (cpu {s['cpu_s']:.2f}, sys "
              f"{s['sys_s']:.2f}), faults {s['minor_faults']:.0f}, loop step "
              f"{s['loop_step_s']:.2f} s, peak {s['peak_rss_mib']:.0f} MiB", flush=True)
    rec.write({"settings": SETTINGS, "skip": args.skip, "steps_per_process": args.steps,
               "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
