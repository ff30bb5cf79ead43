"""Code-RL demo on the embedded model (issue 16 acceptance 6): held-out pass rate before and
after GRPO on parameterised Python function tasks, graded in sandboxes from the warm pool.

Problems: envs/code_families.py, 76 training and 76 held-out problems split by parameter
(disjoint by construction; checked here on (family, params) and prompt text, and again by
`traingym.evaluate`'s overlap check against the run's dataset file). Each prompt is pre-filled
with "```python\\ndef NAME("; each completion runs in a bwrap sandbox from the run's warm pool
against 8+ hidden tests; the training reward is the fraction passed.

Steps, in one process, timed together (`wall_s`):
1. evaluate the base model on every held-out problem (`traingym.evaluate`): greedy, and
   --eval-samples samples at T=1; a sample passes when every hidden test passes;
2. train (`traingym.train`, sync mode, the default config with the overrides below);
3. evaluate the final checkpoint the same way (same rows, same seed).

The result file (benchmarks/resultfile.py: a new file under benchmarks/results/code_rl_demo/,
with provenance) gets: held-out pass rates before and after (sampled pass@1 at T=1, the named
target; greedy pass rate; mean fraction of tests passed), each with its standard error over
problems and the paired per-problem difference with its SE and z; the training reward and
seconds of every step; the wall time of each phase; and the sandbox pool over the training run:
per step (from events.jsonl and the sandbox_acquire spans of the trace, which carry the pool's
state: sandbox/pool.py `snapshot`) the acquisitions, queue wait, sandboxes live, the
Little's-law target (busy = rate x hold, buffer) the pool computed, and utilisation (busy /
live sandbox-seconds); and the same over the whole run with the L = lambda x W check.

    PYTHONPATH=src .venv/bin/python benchmarks/code_rl_demo.py        # the real run (minutes)
        # -> benchmarks/results/code_rl_demo/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/code_rl_demo.py --tiny --out /tmp/crl.json

--tiny: the tiny random model, 2 steps, 8 held-out problems: a smoke test of the script, not a
result. --heldout N: evaluate only the first N held-out problems (a timing check, not a result:
the result file says how many were used).

Defaults (24 steps of 8 prompts x 4 samples, 32 new tokens, lr 2e-5, 4 eval samples) are
sized to fit 15 minutes on a quiet 2-core machine; they were not tuned by runs. 32 tokens hold
the closing fence of almost every answer seen (15-25 tokens; the model then keeps writing
prose, which the grader cuts off at the fence).

Not covered: more than one seed; async mode; Ray sandbox workers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import resultfile


def write_rows(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def score(per_prompt: list[float]):
    """Mean and standard error over problems (evaluate.py's Score)."""
    from traingym.envs.evaluate import Score

    n, mean = len(per_prompt), statistics.fmean(per_prompt)
    se = (statistics.variance(per_prompt) / n) ** 0.5 if n > 1 else 0.0
    return Score(mean, se, n, per_prompt)


def pass_scores(result) -> dict:
    """Per-problem pass rates and mean rewards of an EvalResult, as Score objects."""
    by_mode: dict[str, dict[int, list[dict]]] = {"greedy": {}, "sampled": {}}
    for rec in result.records:
        by_mode[rec["mode"]].setdefault(rec["prompt_index"], []).append(rec)
    out = {}
    for mode, groups in by_mode.items():
        order = sorted(groups)
        out[f"{mode}_pass"] = score([statistics.fmean(r["passed"] for r in groups[i])
                                      for i in order])
        out[f"{mode}_reward"] = score([statistics.fmean(r["reward"] for r in groups[i])
                                        for i in order])
    return out


def compare(before: dict, after: dict) -> dict:
    from traingym.envs.evaluate import paired_difference

    return {name: {"before": before[name].summary(), "after": after[name].summary(),
                   "paired": paired_difference(after[name], before[name])}
            for name in before}


def step_windows(spans) -> dict[int, tuple[int, int]]:
    return {e["args"]["step"]: (e["ts"], e["ts"] + e["dur"]) for e in spans.spans
            if e["name"] == "step" and "step" in e.get("args", {})}


def acquire_spans(spans, a: int, b: int) -> list[dict]:
    return sorted((e for e in spans.spans if e["name"] == "sandbox_acquire"
                   and a <= e["ts"] + e["dur"] <= b and "live" in e.get("args", {})),
                  key=lambda e: e["ts"] + e["dur"])


def pool_window(acq: list[dict], seconds: float, nxt: dict | None = None) -> dict:
    """Pool figures over one window from its sandbox_acquire spans (in end order); `nxt`: the
    first acquisition after the window (the cycle's end), if any."""
    if not acq:
        return {"acquisitions": 0}
    waits = sorted(e["dur"] / 1e6 for e in acq)
    first, last = acq[0]["args"], acq[-1]["args"]
    end = nxt["args"] if nxt is not None else last
    burst_busy, burst_live = last["busy_s"] - first["busy_s"], last["live_s"] - first["live_s"]
    cycle_busy, cycle_live = end["busy_s"] - first["busy_s"], end["live_s"] - first["live_s"]
    return {
        "acquisitions": len(acq), "window_s": seconds,
        "grading_span_s": (acq[-1]["ts"] + acq[-1]["dur"] - acq[0]["ts"]) / 1e6,
        "wait_sum_s": sum(waits), "wait_mean_s": statistics.fmean(waits),
        "wait_p50_s": waits[len(waits) // 2], "wait_max_s": waits[-1],
        "waited_over_10ms": sum(w > 0.01 for w in waits),
        "live_max": max(e["args"]["live"] for e in acq),
        "live_mean_at_acquire": statistics.fmean(e["args"]["live"] for e in acq),
        "in_use_max": max(e["args"]["in_use"] for e in acq),
        "max_size": last["max_size"],
        "target_busy_max": max(e["args"]["target_busy"] for e in acq),
        "target_buffer_max": max(e["args"]["target_buffer"] for e in acq),
        "target_last": [last["target_busy"], last["target_buffer"]],
        "rate_per_s_max": max(e["args"]["rate_per_s"] for e in acq),
        "hold_s_last": last["hold_s"], "ready_s_last": last["ready_s"],
        "started_total": last["started"],
        # busy / live sandbox-seconds: during the step's grading (its first to its last
        # acquisition) and over its whole cycle (to the next step's first acquisition: the
        # pool stays warm while the engine generates and the trainer trains)
        "utilisation_grading": burst_busy / burst_live if burst_live > 0 else None,
        "utilisation_cycle": cycle_busy / cycle_live if cycle_live > 0 else None,
    }


def pool_report(run_dir: Path, events: list[dict]) -> dict:
    """Per step and over the training run (module docstring)."""
    from traingym.observability.utilisation import Spans

    spans = Spans(run_dir)
    spans.read()
    windows = step_windows(spans)
    if not windows:
        return {"per_step": [], "run": None}
    a0, b0 = min(w[0] for w in windows.values()), max(w[1] for w in windows.values())
    every = acquire_spans(spans, a0, b0)
    per_step = []
    for ev in events:
        row = {"step": ev["step"], "seconds_step": ev.get("seconds_step"),
               "wait_sandbox_queue_s": ev.get("wait_sandbox_queue_s"),
               "util_env_s": ev.get("util_env_s")}
        if ev["step"] in windows:
            a, b = windows[ev["step"]]
            acq = acquire_spans(spans, a, b)
            nxt = next((e for e in every if e["ts"] + e["dur"] > b), None)
            row.update(pool_window(acq, (b - a) / 1e6, nxt))
        per_step.append(row)
    run = pool_window(every, (b0 - a0) / 1e6)
    run.pop("grading_span_s", None)
    run.pop("utilisation_grading", None)
    if "utilisation_cycle" in run:  # busy / live sandbox-seconds over the training steps
        run["utilisation"] = run.pop("utilisation_cycle")
    if every:
        first, last = every[0]["args"], every[-1]["args"]
        t = (every[-1]["ts"] + every[-1]["dur"] - every[0]["ts"] - every[0]["dur"]) / 1e6
        n = last["acquired"] - first["acquired"]  # acquisitions after the first one
        busy = last["busy_s"] - first["busy_s"]  # holds released in the interval
        run["over_training"] = {
            "seconds": t, "acquisitions_per_s": n / t if t > 0 else None,
            "mean_hold_s": busy / n if n else None,
            "mean_in_use": busy / t if t > 0 else None,
            "mean_live": (last["live_s"] - first["live_s"]) / t if t > 0 else None,
            "note": "from the first to the last acquisition of the training steps. Little's "
                    "law L = lambda x W: mean sandboxes in use = acquisitions per second x "
                    "mean hold. Acquisitions come in bursts "
                    "(a step's completions are graded together, then none while the engine "
                    "generates and the trainer trains), so the pool sizes itself from its "
                    "decayed rate estimate (rate_per_s_max, time constant 5 s), far above "
                    "this average, and its queue wait is that of each burst"}
    return {"per_step": per_step, "run": run}


def main() -> None:
    import traingym
    from traingym.envs.code_env import CodeEnvMaker
    from traingym.envs.code_families import check_disjoint, family_rows
    from traingym.observability.events import read_events

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--eval-samples", type=int, default=4, help="samples per held-out problem")
    ap.add_argument("--heldout", type=int, default=0,
                    help="evaluate only the first N held-out problems (timing checks; 0: all)")
    ap.add_argument("--backend", default="bwrap", help="sandbox backend (bwrap or process)")
    ap.add_argument("--tiny", action="store_true", help="tiny model, 2 steps: smoke only")
    ap.add_argument("--work-dir", default=None, help="where rows, the run and evals go "
                    "(default: a temporary folder, removed)")
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("code_rl_demo", args)
    if args.tiny:
        args.steps, args.heldout, args.prompts_per_step = 2, args.heldout or 8, 4
        args.max_new_tokens, args.eval_samples = min(args.max_new_tokens, 16), 2

    train_rows, heldout = family_rows("train"), family_rows("heldout")
    check_disjoint(train_rows, heldout)
    if args.heldout:
        heldout = heldout[:args.heldout]
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work_dir or tmp)
        if args.work_dir and work.exists() and any(work.iterdir()):
            raise SystemExit(f"--work-dir {work} is not empty; give a new folder")
        config = traingym.build_config("tiny" if args.tiny else "default", overrides={
            "steps": args.steps,
            "task": {"prefill": "", "dataset": write_rows(work / "train.jsonl", train_rows),
                     "eval_dataset": write_rows(work / "heldout.jsonl", heldout)},
            "rollout": {"prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
                        "max_new_tokens": args.max_new_tokens},
            "trainer": {"lr": args.lr},
            "eval": {"before": False, "after": False, "num_prompts": len(heldout),
                     "samples_per_prompt": args.eval_samples},
            "observability": {"samples_per_step": 1}})
        env = CodeEnvMaker(args.backend)
        model = "tiny" if args.tiny else "embedded"

        def evaluate(spec, name):
            t0 = time.monotonic()
            res = traingym.evaluate(spec, config=config, env=env, out=work / name)
            return res, time.monotonic() - t0

        before, eval_before_s = evaluate(model, "eval_before")
        t0 = time.monotonic()
        result = traingym.train(config, env=env, run_dir=work / "run")
        train_s = time.monotonic() - t0
        after, eval_after_s = evaluate(work / "run", "eval_after")
        events = read_events(work / "run")
        pool = pool_report(work / "run", events)
        wall = time.monotonic() - t_start
    scores = compare(pass_scores(before), pass_scores(after))
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "tiny": args.tiny,
        "model": model, "backend": args.backend,
        "settings": {k: getattr(args, k) for k in ("steps", "prompts_per_step", "group_size",
                                                    "max_new_tokens", "lr", "eval_samples")},
        "problems": {"train": len(train_rows), "heldout_used": len(heldout),
                     "heldout_all": len(family_rows("heldout")),
                     "disjoint": "checked on (family, params) and prompt text",
                     "overlap_check": after.summary["overlap"]},
        "target": "sampled_pass: held-out pass@1 at T=1 (every hidden test passes)",
        "heldout": scores,
        "wall_s": wall, "seconds": {"eval_before": eval_before_s, "train": train_s,
                                    "eval_after": eval_after_s},
        "reward_mean_per_step": [e["reward_mean"] for e in events],
        "seconds_step": [e["seconds_step"] for e in events],
        "final_metrics": {k: v for k, v in result.final_metrics.items()
                          if isinstance(v, int | float | str | None)},
        "pool": pool,
    }
    path = rec.write(out)
    for name, d in scores.items():
        p = d["paired"]
        z = f"{p['z']:.1f}" if p["z"] is not None else "-"
        print(f"held-out {name}: {d['before']['mean']:.3f} -> {d['after']['mean']:.3f} "
              f"({p['delta']:+.3f} ± {p['se']:.3f}, z {z})")
    run = pool["run"] or {}
    print(f"{len(events)} steps; wall {wall:.0f} s (eval {eval_before_s:.0f} + train "
          f"{train_s:.0f} + eval {eval_after_s:.0f}); pool: {run.get('acquisitions')} "
          f"acquisitions, mean wait {run.get('wait_mean_s')}, utilisation "
          f"{run.get('utilisation')} over training; wrote {path}")


if __name__ == "__main__":
    main()
