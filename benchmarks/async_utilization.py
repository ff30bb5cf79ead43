"""Trainer utilisation, sync against async, side by side on one workload with heavy-tailed
environment latency.

Workload: a ~2.6M-parameter Llama (hidden 256, 4 layers; the tiny preset's tokenizer, built
once into a temporary folder), the tiny preset's digit-fraction reward behind
envs/latency.py's DelayedReward: every sample's env step waits a lognormal time (median
--median-s, sigma --sigma; sigma 1 gives p99 about 10x the median). The same steps, batch
and seeds run under mode=sync and mode=async with max_staleness 1, 2 and 4 (one engine
process on one torch thread over tcp; the trainer on one thread). Each configuration runs in
its own fresh Python process, one after the other.

Per configuration and seed, over the steps after --warmup (the first steps include engine
start-up):
- trainer idle fraction: time the trainer waited for groups / step time (sync: the whole
  rollout, as the trainer has nothing else to do meanwhile);
- samples per second: trained samples / step time, and its ratio to the sync run of the
  same seed;
- reward against samples: reward_mean of the trained groups every few steps, and the mean
  over the last half of the run (every configuration trains on the same number of samples);
  across seeds, mean and standard error, and each async configuration's difference to sync;
- async: drops (too stale), mean staleness, restarts;
- the simulator's prediction (cluster/simulate.py) next to each measurement, calibrated with
  the engine's batch time measured alone here (two batch sizes, a line through them) and the
  run's own mean train and publish times (inputs the simulator does not model: they vary
  with what else shares the cores); env latency as configured. Idle fraction and samples/s
  are predicted, not fitted.
Seeds run one after another, each running every configuration in turn (so slow phases of
the machine fall on all of them); each run is its own fresh Python process. Figures across
seeds are medians unless marked mean.
Hardware differs by design: sync uses one core for everything; async uses one for the
trainer and one for the engine (that is what disaggregation buys). Prints a table and writes
benchmarks/results/async_utilization.json.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/async_utilization.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {"sync": None, "async-k1": 1, "async-k2": 2, "async-k4": 4}


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


def calibrate_engine(model_dir: Path, prompts: int, tokens: int) -> tuple[float, float]:
    """Seconds per engine batch as fixed + per_row x rows, from 1 group and `prompts` groups."""
    import torch

    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task
    from traingym.models.loader import load_policy
    from traingym.rollout.torch_engine import TorchEngine
    from traingym.types import GenerationRequest, SamplingParams

    torch.set_num_threads(1)
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


def predict(name: str, args, gen: tuple[float, float], run: dict, seed: int) -> dict:
    from traingym.cluster.simulate import SimConfig, simulate

    k = CONFIGS[name]
    r = simulate(SimConfig(steps=args.steps, prompts_per_step=args.prompts, group_size=4,
                           mode="sync" if k is None else "async", max_staleness=k or 0,
                           gen_fixed_s=gen[0], gen_row_s=gen[1], env_median_s=args.median_s,
                           env_sigma=args.sigma, train_s=run["seconds_train_mean"],
                           publish_s=run["seconds_sync_mean"], warmup=args.warmup, seed=seed))
    return {"trainer_idle_frac": r.trainer_idle_frac, "samples_per_s": r.samples_per_s,
            "dropped": r.dropped}


def run_one(name: str, args) -> None:
    """Run one configuration in this process (called in a fresh subprocess)."""
    import traingym
    from traingym.envs.latency import DelayedReward
    from traingym.envs.tasks import digit_fraction

    over = {"steps": args.steps, "threads": 1, "seed": args.seed,
            "model": {"path": args.model_dir, "engine_dtype": "float32"},
            "eval": {"before": False, "after": False},
            "rollout": {"prompts_per_step": args.prompts, "group_size": 4,
                        "max_new_tokens": args.tokens}}
    if CONFIGS[name] is not None:
        over.update({"mode": "async", "weights": {"transport": "tcp"},
                     "async": {"max_staleness": CONFIGS[name]}})
    cfg = traingym.build_config("tiny", overrides=over)
    traingym.train(cfg, env=DelayedReward(digit_fraction, args.median_s, args.sigma, args.seed),
                   run_dir=args.run_dir, progress=False)


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


def summarize_seeds(runs: dict[int, dict], base: dict[int, dict] | None) -> dict:
    """Across seeds: medians of the rates, mean +- SE of rewards and of reward - sync's."""
    med = lambda key: statistics.median(r[key] for r in runs.values())  # noqa: E731
    out = {"trainer_idle_frac": med("trainer_idle_frac"), "samples_per_s": med("samples_per_s"),
           "seconds_train_mean": med("seconds_train_mean"),
           "reward_last_half": _mean_se([r["reward_last_half"] for r in runs.values()]),
           "simulated_samples_per_s": statistics.median(
               r["simulated"]["samples_per_s"] for r in runs.values()),
           "simulated_idle": statistics.median(
               r["simulated"]["trainer_idle_frac"] for r in runs.values())}
    out["simulator_error"] = out["simulated_samples_per_s"] / out["samples_per_s"] - 1
    if base:
        out["x_sync"] = statistics.median(runs[s]["samples_per_s"] / base[s]["samples_per_s"]
                                          for s in runs)
        out["reward_minus_sync"] = _mean_se([runs[s]["reward_last_half"]
                                             - base[s]["reward_last_half"] for s in runs])
    if "dropped" in next(iter(runs.values())):
        out["dropped"] = sum(r["dropped"] for r in runs.values())
        out["staleness_mean"] = statistics.fmean(r["staleness_mean"] for r in runs.values())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--median-s", type=float, default=0.05)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # for --one
    p.add_argument("--only", nargs="*", default=list(CONFIGS))
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(Path(__file__).parent / "results/async_utilization.json"))
    args = p.parse_args()
    if args.one:
        run_one(args.one, args)
        return
    runs: dict[str, dict[int, dict]] = {name: {} for name in args.only}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir)
        gen = calibrate_engine(model_dir, args.prompts, args.tokens)
        for seed in args.seeds:
            for name in args.only:
                run_dir = Path(tmp) / f"{name}-{seed}"
                cmd = [sys.executable, __file__, "--one", name, "--model-dir", str(model_dir),
                       "--run-dir", str(run_dir), "--steps", str(args.steps), "--prompts",
                       str(args.prompts), "--tokens", str(args.tokens), "--median-s",
                       str(args.median_s), "--sigma", str(args.sigma), "--seed", str(seed)]
                t0 = time.monotonic()
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                r = {**summarize(run_dir, args.warmup, 4), "wall_s": time.monotonic() - t0}
                r["simulated"] = predict(name, args, gen, r, seed)
                runs[name][seed] = r
                print(f"seed {seed} {name:9} idle {r['trainer_idle_frac']:6.1%} samples/s "
                      f"{r['samples_per_s']:6.1f} (simulated {r['simulated']['samples_per_s']:6.1f})"
                      f" reward {r['reward_last_half']:.3f}", flush=True)
    base = runs.get("sync")
    summary = {name: summarize_seeds(rs, base if name != "sync" else None)
               for name, rs in runs.items()}
    print(f"\n{len(args.seeds)} seeds; medians, reward as mean +- SE over seeds")
    print(f"{'config':9} {'idle':>6} {'samples/s':>9} {'x sync':>6} {'reward (2nd half)':>18} "
          f"{'vs sync':>16} {'dropped':>7} {'sim idle':>8} {'sim samples/s':>14}")
    for name, r in summary.items():
        rw, d = r["reward_last_half"], r.get("reward_minus_sync")
        vs = f"{d[0]:+.3f} +- {d[1]:.3f}" if d else "-"
        print(f"{name:9} {r['trainer_idle_frac']:6.1%} {r['samples_per_s']:9.1f} "
              f"{r.get('x_sync', 1.0):6.2f} {rw[0]:10.3f} +- {rw[1]:.3f} {vs:>16} "
              f"{r.get('dropped', '-'):>7} {r['simulated_idle']:8.1%} "
              f"{r['simulated_samples_per_s']:8.1f} ({r['simulator_error']:+.0%})")
    print(f"engine batch {gen[0]:.3f} s + {gen[1] * 1e3:.2f} ms/row (measured alone)")
    print("reward against samples (seed %d, every 5th step):" % args.seeds[0])
    for name, rs in runs.items():
        curve = rs[args.seeds[0]]["reward_curve"]
        print(f"  {name:9} " + " ".join(f"{n}:{v:.3f}" for n, v in curve[4::5]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()
                                                   if k not in ("one", "model_dir", "run_dir",
                                                                "seed")},
                                          "engine_batch_s": {"fixed": gen[0], "per_row": gen[1]},
                                          "summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
