"""Trainer utilisation, sync against async, side by side on one workload with heavy-tailed
environment latency, at equal CPU and (a separate, labelled figure) with more hardware.

Workload: a ~2.6M-parameter Llama (hidden 256, 4 layers; the tiny preset's tokenizer, built
once into a temporary folder), the tiny preset's digit-fraction reward behind
envs/latency.py's DelayedReward: every sample's env step waits a lognormal time (median
--median-s, sigma --sigma; sigma 1 gives p99 about 10x the median). The same steps, batch
and seeds run under mode=sync and mode=async with max_staleness 1, 2 and 4 (one engine
process over tcp). Each configuration runs in its own fresh Python process, one after the
other, pinned with os.sched_setaffinity to its cores (the engine process inherits the pin).

CPU per configuration (CONFIGS; recorded in the result file as `cpu` of each run):
- sync: trainer and engine in one process on the two cores of --cores, 2 torch threads
  (the equal-CPU baseline);
- async-kN: the same two cores; the trainer on 1 thread and one engine process on 1 thread;
- sync-1core: one process on the first core of --cores, 1 thread (the more-hardware
  baseline: what the figures before issue 11 compared against).
So "x sync (equal CPU)" = async / sync on the same two cores is the gain from pipelining;
"x sync-1core" = async on two cores / sync on one mixes pipelining with twice the CPU, and
sync / sync-1core is the gain of sync itself from the second core. The issue-5 targets
(sync idle >= 50%, async idle <= 15%, >= 1.8x sync) are judged on the equal-CPU figures
(`targets` in the result file). Limits: the pin holds the processes to the cores, it does not
keep other jobs off them; on a shared machine the rates still move with the load.

Per configuration and seed, over the steps after --warmup (the first steps include engine
start-up):
- trainer idle fraction: time the trainer waited for groups / step time (sync: the whole
  rollout, as the trainer has nothing else to do meanwhile);
- samples per second: trained samples / step time, and its ratios to the sync runs of the
  same seed;
- CPU seconds of the run's processes (getrusage of the reaped children, start-up included)
  and that over wall time: the cores it actually used;
- reward against samples: reward_mean of the trained groups every few steps, and the mean
  over the last half of the run (every configuration trains on the same number of samples);
  across seeds, mean and standard error, and each configuration's difference to sync (equal
  CPU) on the same seed;
- async: drops (too stale), mean staleness, restarts;
- the simulator's prediction (plan/simulate.py) next to each measurement, held out: its
  inputs are the engine's batch time measured alone here at the engine's thread count (1, or
  2 for sync; two batch sizes, a line through them), the mean train and publish times of the
  OTHER seeds' runs of the same configuration (separate processes; inputs the simulator does
  not model: they vary with what else shares the cores), never the predicted run's own, and
  env latency as configured. Idle fraction and samples/s are predicted, not fitted; the error
  (`heldout_simulator_error`) is an accuracy check. With one seed there is nothing to hold
  out: no prediction. --rescore FILE recomputes the held-out predictions of an earlier result
  file from the measurements it holds (no new runs) and prints them beside the file's own.
Seeds run one after another, each running every configuration in turn (so slow phases of
the machine fall on all of them). Figures across seeds are medians unless marked mean.
Prints a table and writes a new result file with its provenance (benchmarks/resultfile.py).

    PYTHONPATH=src .venv/bin/python benchmarks/async_utilization.py
        # -> benchmarks/results/async_utilization/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/async_utilization.py --steps 6 --warmup 2 \
        --seeds 0 --out /tmp/async_utilization_smoke.json      # smoke: about 2 min
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
from dataclasses import dataclass
from pathlib import Path

import resultfile


@dataclass(frozen=True)
class Side:
    """One configuration and the CPU it gets: pinned to the first `cores` of --cores, the
    trainer on `threads` torch threads (sync: the in-process engine shares them; async: plus
    one engine process on 1 thread, cluster/engine_process.py)."""

    max_staleness: int | None  # None: mode=sync
    cores: int
    threads: int


CONFIGS = {
    "sync-1core": Side(None, 1, 1),  # the more-hardware baseline
    "sync": Side(None, 2, 2),  # the equal-CPU baseline
    "async-k1": Side(1, 2, 1),
    "async-k2": Side(2, 2, 1),
    "async-k4": Side(4, 2, 1),
}
EQUAL, ONE_CORE = "sync", "sync-1core"


def allocation(name: str, cores: list[int]) -> dict:
    """The CPU a configuration is given, as the result file records it."""
    side = CONFIGS[name]
    out = {"cores": cores[: side.cores], "trainer_threads": side.threads}
    if side.max_staleness is None:
        out["engine"] = "in the trainer's process, on the trainer's threads"
    else:
        out.update(engine_processes=1, engine_threads=1)
    return out


def build_model(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from traingym.models.loader import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)


def calibrate_engine(model_dir: Path, prompts: int, tokens: int, threads: int
                     ) -> tuple[float, float]:
    """Seconds per engine batch as fixed + per_row x rows, from 1 group and `prompts` groups,
    on `threads` torch threads (in this process, pinned to the benchmark's cores)."""
    import torch

    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task
    from traingym.models.loader import load_policy
    from traingym.rollout.torch_engine import TorchEngine
    from traingym.core.types import GenerationRequest, SamplingParams

    torch.set_num_threads(threads)
    model, tok = load_policy(str(model_dir))
    engine = TorchEngine(model, tok.pad_token_id, 64, torch.float32)
    render = PromptRenderer(tok, "The answer is")
    rows = builtin_task("arith", 16).train
    params = SamplingParams(1.0, 1.0, 0, tokens, (tok.eos_token_id,))

    def timed(n: int) -> float:
        reqs = [GenerationRequest(render.ids(rows[i]), 4, params, i) for i in range(n)]
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            engine.generate_sync(reqs)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    timed(1)  # warm-up
    one, many = timed(1), timed(prompts)
    per_row = (many - one) / (4 * (prompts - 1))
    return one - 4 * per_row, per_row


def predict(name: str, args, gen: tuple[float, float], train_s: float, publish_s: float,
            seed: int) -> dict:
    """The simulator's trainer idle, samples/s and drops for configuration `name` at `seed`,
    with the engine batch time `gen` (fixed, per row) and the given train and publish times."""
    from traingym.plan.simulate import SimConfig, simulate

    k = CONFIGS[name].max_staleness
    r = simulate(SimConfig(steps=args.steps, prompts_per_step=args.prompts, group_size=4,
                           mode="sync" if k is None else "async", max_staleness=k or 0,
                           gen_fixed_s=gen[0], gen_row_s=gen[1], env_median_s=args.median_s,
                           env_sigma=args.sigma, train_s=train_s, publish_s=publish_s,
                           warmup=args.warmup, seed=seed))
    return {"trainer_idle_frac": r.trainer_idle_frac, "samples_per_s": r.samples_per_s,
            "dropped": r.dropped}


def predict_heldout(name: str, args, gen: tuple[float, float], runs: dict[int, dict],
                    seed: int) -> dict | None:
    """The prediction for `seed`'s run of `name` from the mean train and publish times of the
    other seeds' runs of `name` (never its own); None with a single seed."""
    others = sorted(s for s in runs if s != seed)
    if not others:
        return None
    train_s = statistics.fmean(runs[s]["seconds_train_mean"] for s in others)
    publish_s = statistics.fmean(runs[s]["seconds_sync_mean"] for s in others)
    return {**predict(name, args, gen, train_s, publish_s, seed), "inputs_from_seeds": others,
            "train_s": train_s, "publish_s": publish_s}


def pin(cores: list[int]) -> None:
    """Pin this process (and every thread and process it starts later) to `cores`."""
    os.sched_setaffinity(0, cores)
    if sorted(os.sched_getaffinity(0)) != sorted(cores):
        raise RuntimeError(f"pinned to {cores}, but the process runs on "
                           f"{sorted(os.sched_getaffinity(0))}")


def run_one(name: str, args) -> None:
    """Run one configuration in this process (called in a fresh subprocess, pinned before
    torch starts any thread, so its threads and the engine process inherit the pin)."""
    side = CONFIGS[name]
    pin(args.pin)
    import torch

    import traingym
    from traingym.envs.latency import DelayedReward
    from traingym.envs.tasks import digit_fraction

    over = {"steps": args.steps, "threads": side.threads, "seed": args.seed,
            "model": {"path": args.model_dir, "engine_dtype": "float32"},
            "eval": {"before": False, "after": False},
            "rollout": {"prompts_per_step": args.prompts, "group_size": 4,
                        "max_new_tokens": args.tokens}}
    if side.max_staleness is not None:
        over.update({"mode": "async", "weights": {"transport": "tcp"},
                     "async": {"max_staleness": side.max_staleness, "engines": 1}})
    cfg = traingym.build_config("tiny", overrides=over)
    traingym.train(cfg, env=DelayedReward(digit_fraction, args.median_s, args.sigma, args.seed),
                   run_dir=args.run_dir, progress=False)
    seen = {"affinity": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads()}
    (Path(args.run_dir) / "cpu_seen.json").write_text(json.dumps(seen))


def summarize(run_dir: Path, warmup: int, group_size: int) -> dict:
    from traingym.observability.events import read_events

    events = read_events(run_dir)
    timed = events[warmup:]
    step_s = sum(e["seconds_step"] for e in timed)
    samples = sum(e["groups"] for e in timed) * group_size
    half = events[len(events) // 2 :]
    out = {
        "trainer_idle_frac": sum(e["seconds_rollout"] for e in timed) / step_s,
        "samples_per_s": samples / step_s,
        "seconds_per_step": step_s / len(timed),
        "seconds_train_mean": statistics.fmean(e["seconds_train"] for e in timed),
        "seconds_sync_mean": statistics.fmean(e["seconds_sync"] for e in timed),
        "reward_last_half": statistics.fmean(e["reward_mean"] for e in half),
        "reward_curve": [(e["step"] * e["groups"] * group_size, round(e["reward_mean"], 4))
                         for e in events],
    }
    if "async_dropped_total" in events[-1]:
        out.update(dropped=events[-1]["async_dropped_total"],
                   staleness_mean=statistics.fmean(e["async_staleness_mean"] for e in events),
                   restarts=events[-1]["async_engine_restarts"])
    return out


def _mean_se(xs: list[float]) -> tuple[float, float]:
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))


def summarize_seeds(runs: dict[int, dict], equal: dict[int, dict] | None,
                    one_core: dict[int, dict] | None) -> dict:
    """Across seeds: medians of the rates and of the ratios to sync on the same seed (on equal
    CPU, and to sync on one core), mean +- SE of rewards and of reward - sync's (equal CPU)."""
    med = lambda key: statistics.median(r[key] for r in runs.values())  # noqa: E731
    out = {"cpu": next(iter(runs.values()))["cpu"],
           "trainer_idle_frac": med("trainer_idle_frac"), "samples_per_s": med("samples_per_s"),
           "seconds_train_mean": med("seconds_train_mean"),
           "cpu_cores_used": med("cpu_cores_used"),
           "reward_last_half": _mean_se([r["reward_last_half"] for r in runs.values()])}
    # held out: each seed predicted from the other seeds' train and publish times
    predicted = [r["simulated_heldout"] for r in runs.values() if r.get("simulated_heldout")]
    out["heldout_simulated_samples_per_s"] = statistics.median(
        p["samples_per_s"] for p in predicted) if predicted else None
    out["heldout_simulated_idle"] = statistics.median(
        p["trainer_idle_frac"] for p in predicted) if predicted else None
    out["heldout_simulator_error"] = (
        out["heldout_simulated_samples_per_s"] / out["samples_per_s"] - 1 if predicted
        else None)
    if equal:
        out["x_sync_equal_cpu"] = statistics.median(
            runs[s]["samples_per_s"] / equal[s]["samples_per_s"] for s in runs)
        out["reward_minus_sync"] = _mean_se([runs[s]["reward_last_half"]
                                             - equal[s]["reward_last_half"] for s in runs])
    if one_core:
        out["x_sync_1core_more_hardware"] = statistics.median(
            runs[s]["samples_per_s"] / one_core[s]["samples_per_s"] for s in runs)
    if "dropped" in next(iter(runs.values())):
        out["dropped"] = sum(r["dropped"] for r in runs.values())
        out["staleness_mean"] = statistics.fmean(r["staleness_mean"] for r in runs.values())
    return out


def targets(summary: dict) -> dict:
    """Issue 5's targets, judged on the equal-CPU figures (sync and async on the same cores)."""
    out = {}
    if EQUAL in summary:
        idle = summary[EQUAL]["trainer_idle_frac"]
        out["sync_idle_at_least_50pct"] = {"value": idle, "met": idle >= 0.5}
    for name, r in summary.items():
        if CONFIGS[name].max_staleness is None:
            continue
        out[f"{name}_idle_at_most_15pct"] = {"value": r["trainer_idle_frac"],
                                              "met": r["trainer_idle_frac"] <= 0.15}
        if "x_sync_equal_cpu" in r:
            out[f"{name}_at_least_1.8x_sync_equal_cpu"] = {"value": r["x_sync_equal_cpu"],
                                                            "met": r["x_sync_equal_cpu"] >= 1.8}
    return out


def print_table(summary: dict, args, gen: dict, runs: dict) -> None:
    print(f"\n{len(args.seeds)} seeds; medians, reward as mean +- SE over seeds")
    print(f"{'config':10} {'cores':>5} {'threads':>7} {'idle':>6} {'samples/s':>9} "
          f"{'x sync':>6} {'x 1core':>7} {'cores used':>10} {'reward (2nd half)':>18} "
          f"{'vs sync':>16} {'dropped':>7} {'sim idle':>8} {'sim samples/s':>14} (held out)")
    for name, r in summary.items():
        c = r["cpu"]
        threads = f"{c['trainer_threads']}" + (f"+{c['engine_threads']}" if "engine_threads" in c
                                               else "")
        rw, d = r["reward_last_half"], r.get("reward_minus_sync")
        vs = f"{d[0]:+.3f} +- {d[1]:.3f}" if d else "-"
        x_eq = f"{r['x_sync_equal_cpu']:.2f}" if "x_sync_equal_cpu" in r else "-"
        x_hw = f"{r['x_sync_1core_more_hardware']:.2f}" if "x_sync_1core_more_hardware" in r \
            else "-"
        sim = (f"{r['heldout_simulated_idle']:8.1%} {r['heldout_simulated_samples_per_s']:8.1f} "
               f"({r['heldout_simulator_error']:+.0%})"
               if r["heldout_simulator_error"] is not None else f"{'n/a (one seed)':>23}")
        print(f"{name:10} {len(c['cores']):5} {threads:>7} {r['trainer_idle_frac']:6.1%} "
              f"{r['samples_per_s']:9.1f} {x_eq:>6} {x_hw:>7} {r['cpu_cores_used']:10.2f} "
              f"{rw[0]:10.3f} +- {rw[1]:.3f} {vs:>16} {r.get('dropped', '-'):>7} {sim}")
    print("x sync: against sync on the same cores (equal CPU: the gain from pipelining); "
          "x 1core: against sync on one core (more hardware); sim: the simulator with each "
          "seed's train and publish times taken from the other seeds' runs (held out)")
    for threads, (fixed, row) in gen.items():
        print(f"engine batch, {threads} thread(s): {fixed:.3f} s + {row * 1e3:.2f} ms/row "
              "(measured alone)")
    print(f"reward against samples (seed {args.seeds[0]}, every 5th step):")
    for name, rs in runs.items():
        curve = rs[args.seeds[0]]["reward_curve"]
        print(f"  {name:10} " + " ".join(f"{n}:{v:.3f}" for n, v in curve[4::5]))


def rescore(path: str) -> dict:
    """Print (and return, for a result file labelled `rescore`) the held-out predictions of an earlier result file, recomputed from the engine
    batch times and the runs' train and publish times it holds, beside the measurements and
    the file's own predictions (those of files written before the held-out check fed each run
    its own train time: a consistency check, not an accuracy one)."""
    data = json.loads(Path(path).read_text())
    a = data["args"]
    args = argparse.Namespace(**{k: a[k] for k in ("steps", "prompts", "median_s", "sigma",
                                                    "warmup")})
    gen = {int(k.split("_")[0]): (v["fixed"], v["per_row"])
           for k, v in data["engine_batch_s"].items()}
    print(f"{path}: {len(a['seeds'])} seeds; medians over seeds")
    scored = {"rescored_file": path, "summary": {}}
    print(f"{'config':10} {'idle':>6} {'samples/s':>9}  {'file: sim idle, samples/s':>27}  "
          f"{'held out: sim idle, samples/s':>31}")
    for name, rs in data["runs"].items():
        if name not in CONFIGS:
            raise SystemExit(f"--rescore: {path} has configuration {name!r}, which this script "
                             f"no longer runs ({sorted(CONFIGS)})")
        rs = {int(seed): r for seed, r in rs.items()}
        g = gen[allocation(name, data["cores"]).get("engine_threads", CONFIGS[name].threads)]
        held = [h for seed in rs if (h := predict_heldout(name, args, g, rs, seed))]
        m = data["summary"][name]
        own = (f"{m['simulated_idle']:6.1%} {m['simulated_samples_per_s']:7.1f} "
               f"({m['simulator_error']:+.0%})" if "simulator_error" in m else "-")
        if held:
            sps = statistics.median(h["samples_per_s"] for h in held)
            idle = statistics.median(h["trainer_idle_frac"] for h in held)
            out = f"{idle:6.1%} {sps:7.1f} ({sps / m['samples_per_s'] - 1:+.0%})"
            scored["summary"][name] = {
                "samples_per_s": m["samples_per_s"], "trainer_idle_frac": m["trainer_idle_frac"],
                "heldout_simulated_samples_per_s": sps, "heldout_simulated_idle": idle,
                "heldout_simulator_error": sps / m["samples_per_s"] - 1,
                "file_simulator_error": m.get("simulator_error")}
        else:
            out = "n/a (one seed)"
        print(f"{name:10} {m['trainer_idle_frac']:6.1%} {m['samples_per_s']:9.1f}  {own:>27}  "
              f"{out:>31}")
    return scored


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--median-s", type=float, default=0.05)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--cores", type=int, nargs=2, default=None,
                   help="the two cores every configuration shares (default: the first two this "
                        "process may run on)")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # for --one
    p.add_argument("--only", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--pin", type=int, nargs="+", help=argparse.SUPPRESS)  # for --one
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--rescore", metavar="JSON", help="print an earlier result file's "
                   "held-out simulator predictions, recomputed from its measurements (no runs)")
    resultfile.add_args(p)
    args = p.parse_args()
    if args.one:
        run_one(args.one, args)
        return
    rec = resultfile.start("async_utilization", args)
    if args.rescore:
        rec.label = rec.label or "rescore"
        rec.write(rescore(args.rescore))
        return
    cores = args.cores or sorted(os.sched_getaffinity(0))[:2]
    if len(set(cores)) != 2:
        raise SystemExit(f"async_utilization: the equal-CPU comparison needs two cores; this "
                         f"process may run on {sorted(os.sched_getaffinity(0))} (--cores A B)")
    pin(cores)  # the calibration runs here, on the same cores
    runs: dict[str, dict[int, dict]] = {name: {} for name in args.only}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir)
        gen = {n: calibrate_engine(model_dir, args.prompts, args.tokens, n) for n in (1, 2)}
        for seed in args.seeds:
            for name in args.only:
                side, run_dir = CONFIGS[name], Path(tmp) / f"{name}-{seed}"
                cpu = allocation(name, cores)
                cmd = [sys.executable, __file__, "--one", name, "--model-dir", str(model_dir),
                       "--run-dir", str(run_dir), "--steps", str(args.steps), "--prompts",
                       str(args.prompts), "--tokens", str(args.tokens), "--median-s",
                       str(args.median_s), "--sigma", str(args.sigma), "--seed", str(seed),
                       "--pin", *map(str, cpu["cores"])]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.monotonic()
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                wall = time.monotonic() - t0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
                seen = json.loads((run_dir / "cpu_seen.json").read_text())
                if seen["affinity"] != sorted(cpu["cores"]) or \
                        seen["torch_threads"] != side.threads:
                    raise RuntimeError(f"{name}: asked for {cpu}, the run saw {seen}")
                r = {**summarize(run_dir, args.warmup, 4), "wall_s": wall, "cpu": cpu,
                     "cpu_seen_by_trainer": seen, "cpu_s": cpu_s, "cpu_cores_used": cpu_s / wall}
                runs[name][seed] = r
                print(f"seed {seed} {name:10} cores {cpu['cores']} idle "
                      f"{r['trainer_idle_frac']:6.1%} samples/s {r['samples_per_s']:6.1f} "
                      f"reward {r['reward_last_half']:.3f} cores used "
                      f"{r['cpu_cores_used']:.2f}", flush=True)
    for name, rs in runs.items():  # predicted once every seed has run: held out
        gen_of = gen[allocation(name, cores).get("engine_threads", CONFIGS[name].threads)]
        for seed, r in rs.items():
            r["simulated_heldout"] = predict_heldout(name, args, gen_of, rs, seed)
    summary = {name: summarize_seeds(  # equal CPU: async against sync on the same two cores
        rs, runs.get(EQUAL) if CONFIGS[name].max_staleness is not None else None,
        runs.get(ONE_CORE) if name != ONE_CORE else None) for name, rs in runs.items()}
    print_table(summary, args, gen, runs)
    judged = targets(summary)
    print("targets, on the equal-CPU figures:")
    for key, t in judged.items():
        print(f"  {key}: {t['value']:.3f} {'met' if t['met'] else 'MISSED'}")
    rec.write({
        "args": {k: v for k, v in vars(args).items()
                 if k not in ("one", "model_dir", "run_dir", "seed", "pin")},
        "cores": cores,
        "cpu_allocation": {name: allocation(name, cores) for name in args.only},
        "engine_batch_s": {f"{n}_threads": {"fixed": g[0], "per_row": g[1]}
                           for n, g in gen.items()},
        "targets_equal_cpu": judged, "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
