"""Train/inference mismatch on the embedded model, and what the importance correction does to it.

For each engine named in --engines (default: torch), runs the sync loop (`traingym.train`,
model.path 'embedded', --steps steps of --prompts prompts x 4 samples, 8 new tokens, T = 1,
fp32 trainer: trainer.bf16_autocast false) in four settings, one run each, same seed:

- engine fp32 / trainer fp32, algorithm.is_correction none and tis (cap 2, token level);
- engine bf16 / trainer fp32 (model.engine_dtype bfloat16), none and tis;

and writes each step's figures from the run's events.jsonl to a new result file
(benchmarks/resultfile.py, with its provenance): mismatch_abs_logp (mean
|log p_trainer - log p_engine| over policy tokens), mismatch_kl_k3 (mean k3, an estimate of
KL(engine || trainer)), and under tis the correction's is_capped_frac (tokens whose ratio
passed the cap: truncated), is_zero_frac and is_weight_mean; with reward, groups kept and
seconds per step, and per setting the means over the steps that trained. `commit_at_start`
(and whether the tree had uncommitted changes then) is read before the first run (the checkout
is shared: it may move while the runs go on; provenance's commit is read when the file is
written).

    PYTHONPATH=src .venv/bin/python benchmarks/mismatch.py                     # ~minutes
        # -> benchmarks/results/mismatch/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/mismatch.py --engines torch,vllm --label vllm
    PYTHONPATH=src .venv/bin/python benchmarks/mismatch.py --model tiny --steps 2 \\
        --out /tmp/mismatch_smoke.json                                         # smoke, seconds

An engine must be registered in rollout/registry.py (ENGINES) and able to run in the engine
dtype asked for; one that is not fails the script before any run, naming it.

Not covered: more than one seed; runs long enough to see the correction change the reward;
async mode (staleness adds to the numerics gap; async_loop.py records the same keys); the
trainer in bf16 autocast (this CPU has no bf16 kernels: benchmarks/results/loop_sync/2026-12-03-647e521.json).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import resultfile

STEP_KEYS = ("step", "groups_kept", "trained_tokens", "reward_mean", "mismatch_abs_logp",
             "mismatch_kl_k3", "is_weight_mean", "is_zero_frac", "is_capped_frac", "loss",
             "seconds_step")
SETTINGS = [(dtype, corr) for dtype in ("float32", "bfloat16") for corr in ("none", "tis")]


def _mean(events: list[dict], key: str) -> float | None:
    vals = [e[key] for e in events if e.get(key) is not None and e["trained_tokens"]]
    return statistics.fmean(vals) if vals else None


def run_one(engine: str, dtype: str, correction: str, args) -> dict:
    import traingym
    from traingym.observability.events import read_events

    preset = "tiny" if args.model == "tiny" else "default"  # tiny: a reward it can earn
    cfg = traingym.build_config(preset, overrides={
        "seed": args.seed, "steps": args.steps, "threads": args.threads,
        "model": {"path": args.model, "engine_dtype": dtype},
        "rollout": {"engine": engine, "prompts_per_step": args.prompts},
        "trainer": {"bf16_autocast": False}, "algorithm": {"is_correction": correction},
        "eval": {"before": False, "after": False}})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        traingym.train(cfg, run_dir=Path(tmp) / "run", progress=False)
        wall = time.monotonic() - t0
        events = read_events(Path(tmp) / "run")
    steps = [{k: e[k] for k in STEP_KEYS if k in e} for e in events]
    means = {k: _mean(events, k) for k in ("mismatch_abs_logp", "mismatch_kl_k3",
                                           "is_weight_mean", "is_zero_frac", "is_capped_frac")}
    row = {"engine": engine, "engine_dtype": dtype, "trainer_dtype": "float32",
           "is_correction": correction, "wall_s": wall, "mean_over_trained_steps": means,
           "steps": steps}
    shown = ", ".join(f"{k} {v:.3g}" for k, v in means.items() if v is not None)
    print(f"{engine:6s} engine {dtype:8s} / trainer float32, {correction:4s}: {shown} "
          f"({wall:.0f} s)", flush=True)
    return row


def check_engines(engines: list[str]) -> None:
    from traingym.rollout import registry

    for name in engines:
        try:
            registry.get(name)
        except ValueError as e:
            raise SystemExit(f"--engines {name}: {e}. Registered engines: {registry.names()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="torch", help="comma-separated rollout.engine names")
    ap.add_argument("--model", default="embedded", help="model.path ('tiny' for a smoke run)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8, help="rollout.prompts_per_step")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (shared machine)")
    ap.add_argument("--seed", type=int, default=0)
    resultfile.add_args(ap)
    args = ap.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    check_engines(engines)
    rec = resultfile.start("mismatch", args)
    checkout = {  # the code the runs import: now
        "commit_at_start": resultfile.git("rev-parse", "HEAD"),
        "uncommitted_changes_at_start": bool(
            resultfile.git("status", "--porcelain", "--untracked-files=no"))}
    rows = [run_one(engine, dtype, corr, args) for engine in engines for dtype, corr in SETTINGS]
    out = {**checkout, "date": time.strftime("%Y-%m-%d"),
           "model": args.model, "steps": args.steps, "prompts_per_step": args.prompts,
           "group_size": 4, "seed": args.seed, "threads": args.threads, "runs": rows}
    rec.write(out)


if __name__ == "__main__":
    main()
