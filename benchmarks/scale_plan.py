"""Scale plan: the pipeline simulator (cluster/simulate.py) sizing a 7B-class GRPO run on 8, 64
and 512 GPUs, sync against async, full against delta weight sync.

Workload (stated, not measured): a 7B-parameter policy (bf16 weights 14 GB), GRPO with 16
samples per prompt, 512-token prompts and 1024-token completions, a code-execution env whose
latency per sample is lognormal (median 1 s, sigma 0.99: p99 = 10x the median), cut at the
sandbox's 20 s wall limit, in a sandbox pool of 8 slots per GPU. The batch grows with the
cluster, 8 prompts per GPU (64, 512 and 4096 prompts x 16 samples at 8, 64 and 512 GPUs: the
same work per GPU per step, so the step time stays comparable; 512 x 16 at 64 GPUs is the
reference workload), plus a 512-GPU run at the fixed 512 x 16 batch. One optimizer step per RL step.

GPU-side rates are assumptions from published figures (ASSUMPTIONS, each with its source;
docs/scale.md discusses them); CPU-side costs of weight sync are the rates measured here
(BENCHMARKS.md "Weight sync"). Configurations per scale:
- sync: colocated (every GPU trains, then generates; trainer_gpus = engines = GPUs), full
  weights in place (the publisher's and the subscriber's hashes);
- async, staleness 1 and 2: the trainer/engine split searched by simulate.size_cluster (every
  trainer size up to 64 GPUs, steps of 16 at 512); weights full or delta over traingym's tcp
  transport (one sender whose 100 Gbit/s NIC every engine shares; publish blocked until all
  have it), or full over a broadcast on 400 Gbit/s InfiniBand (weights/dist.py with NCCL;
  staleness 2; delta's payload is small enough that its link hardly matters).
For each chosen configuration: the smallest sandbox pool within 2% of the given pool's
samples/s, samples/s over seeds 0-3, and the gain in samples/s from doubling one input at
the chosen split (trainer rate, decode rates, env pool, the whole weight-sync cost). At a
balanced split no single doubling gains much; a large gain names what binds.
Sensitivity: the best async configuration of each weak-scaled run re-sized with env latency
x2, decode rates / 2 and training rate / 2; at 512 GPUs also delta with the codec on 8 cores
(parallel over tensors: not implemented, the measured one-core rate x 8).
Runs in about ten minutes on one core (512 GPUs dominate: 65k env steps per simulated step).

    PYTHONPATH=src .venv/bin/python benchmarks/scale_plan.py   # benchmarks/results/scale_plan.json
    PYTHONPATH=src .venv/bin/python benchmarks/scale_plan.py \
        --markdown benchmarks/results/scale_plan.json   # its tables as markdown
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from traingym.cluster.simulate import SimConfig, link_seconds, simulate, size_cluster, train_seconds

GB = 1e9
# name: (value, source). GPU-side figures are published, not measured here.
ASSUMPTIONS = {
    "params": (7e9, "7B-class policy (stated workload)"),
    "decode_tokens_per_s_per_gpu": (
        8000.0, "vLLM v0.6.0, Llama 3.1 8B, 1x H100, 256 concurrent sequences: 8,088 output "
        "tokens/s (LambdaLabsML/vllm-benchmark, benchmark_v0.md)"),
    "seq_tokens_per_s": (
        150.0, "one sequence alone, bf16 8B on H100: 75 tokens/s measured on an A100 40GB "
        "(johnmusgrave.com vLLM sweep, 77% of its HBM roofline) x 2.2 (H100 SXM 3.35 TB/s "
        "vs 1.55 TB/s); NVIDIA NIM lists 214 tokens/s at concurrency 1"),
    "train_tokens_per_s_per_gpu": (
        5000.0, "torchtitan docs/performance.md: Llama 3.1 8B, 8x H100, FSDP + torch.compile, "
        "bf16: 6,667 tokens/s/GPU; x 3/4 for the reference model's forward (KL)"),
    "allreduce_bytes_per_s_nvlink": (
        450 * GB, "8x H100 SXM NVLink all-reduce busbw 460-480 GB/s (nccl-tests reference, "
        "docs.alayanew.com); trainer within one node"),
    "allreduce_bytes_per_s_ib": (
        40 * GB, "400 Gbit/s per GPU (torchtitan's H100 cluster; Dell XE9680 8x 400Gb IB, "
        "MLCommons) = 50 GB/s, 80% of it; trainer over several nodes"),
    "tcp_link_bytes_per_s": (12.5 * GB, "100 Gbit/s Ethernet at line rate (the trainer's NIC)"),
    "tcp_latency_s": (50e-6, "TCP round trip on a datacenter network (order of magnitude)"),
    "ib_link_bytes_per_s": (50 * GB, "400 Gbit/s InfiniBand at line rate"),
    "ib_latency_s": (5e-6, "InfiniBand (order of magnitude)"),
    "env_median_s": (1.0, "code execution with tests (stated workload, not measured)"),
    "env_sigma": (0.99, "lognormal sigma for p99 = 10x median: ln 10 / 2.326"),
    "env_timeout_s": (20.0, "traingym's sandbox wall limit (sandbox/base.py Limits.wall_s)"),
    "env_workers_per_gpu": (
        8, "one sandbox per CPU core, 64 of an 8-GPU node's 112 cores (2x Xeon 8480C, "
        "MLCommons H200-SXM-141GBx8 system description)"),
}
# CPU-side, measured here (BENCHMARKS.md, "Weight sync", one core; run 3 of the throughput table)
MEASURED = {
    "delta_changed_fraction": (0.0113, "step 3 of the SmolLM2-135M run, lr 1e-6"),
    "delta_bytes_per_changed": (1.486, "traingym delta codec at 1.13% changed"),
    "hash_bytes_per_s": (18.8 * GB, "xxh3-128 state hash"),
    "delta_encode_bytes_per_s": (1.12 * GB, "encode + target hash (publisher)"),
    "delta_decode_bytes_per_s": (1.45 * GB, "decode + base re-hash + result hash (subscriber)"),
}
A = {k: v for k, (v, _) in {**ASSUMPTIONS, **MEASURED}.items()}
PROMPT_TOKENS, COMPLETION_TOKENS, GROUP = 512, 1024, 16


def workload(gpus: int, prompts: int, mode: str, staleness: int, steps: int) -> SimConfig:
    return SimConfig(
        steps=steps, warmup=4, prompts_per_step=prompts, group_size=GROUP, mode=mode,
        max_staleness=staleness, gen_fixed_s=0.0, gen_row_s=0.0,
        completion_tokens=COMPLETION_TOKENS, engine_tokens_per_s=A["decode_tokens_per_s_per_gpu"],
        seq_tokens_per_s=A["seq_tokens_per_s"], env_median_s=A["env_median_s"],
        env_sigma=A["env_sigma"], env_timeout_s=A["env_timeout_s"],
        env_workers=A["env_workers_per_gpu"] * gpus, train_s=0.0,
        train_tokens_per_sample=PROMPT_TOKENS + COMPLETION_TOKENS,
        train_tokens_per_s_per_gpu=A["train_tokens_per_s_per_gpu"], grad_bytes=2 * A["params"],
        seed=0)


def weights(cfg: SimConfig, codec: str, link: str, codec_cores: int = 1) -> SimConfig:
    """Publish (trainer blocked), wire bytes and engine apply for a codec over a link."""
    state = 2 * A["params"]
    if codec == "full":
        wire, publish, apply = state, state / A["hash_bytes_per_s"], state / A["hash_bytes_per_s"]
    else:
        wire = A["params"] * A["delta_changed_fraction"] * A["delta_bytes_per_changed"]
        publish = state / (A["delta_encode_bytes_per_s"] * codec_cores)
        apply = state / (A["delta_decode_bytes_per_s"] * codec_cores)
    if link == "local":  # sync colocated: in place, no network
        return replace(cfg, publish_s=publish, apply_s=apply, weight_bytes=0.0)
    rate, latency, fanout = {"tcp": ("tcp_link_bytes_per_s", "tcp_latency_s", "sender"),
                             "ib": ("ib_link_bytes_per_s", "ib_latency_s", "broadcast")}[link]
    return replace(cfg, publish_s=publish, apply_s=apply, weight_bytes=wire,
                   link_bytes_per_s=A[rate], link_latency_s=A[latency], fanout=fanout,
                   publish_waits_for_link=True)


def rows(gpus: int, prompts: int, steps: int) -> list[tuple[str, SimConfig]]:
    def base(mode, k):
        return replace(workload(gpus, prompts, mode, k, steps), node_gpus=8,
                       allreduce_bytes_per_s=A["allreduce_bytes_per_s_nvlink"],
                       internode_bytes_per_s=A["allreduce_bytes_per_s_ib"])

    out = [("sync, colocated", weights(base("sync", 0), "full", "local"))]
    for k, codec, link in [(1, "full", "tcp"), (1, "delta", "tcp"), (2, "full", "tcp"),
                           (2, "delta", "tcp"), (2, "full", "ib")]:
        out.append((f"async k={k}, {codec}, {link}", weights(base("async", k), codec, link)))
    return out


def doubled(cfg: SimConfig) -> dict[str, SimConfig]:
    """The configuration with one input twice as fast (for the 'limit' column)."""
    return {
        "trainer": replace(cfg, train_tokens_per_s_per_gpu=2 * cfg.train_tokens_per_s_per_gpu,
                           allreduce_bytes_per_s=2 * cfg.allreduce_bytes_per_s,
                           internode_bytes_per_s=2 * cfg.internode_bytes_per_s),
        "decode": replace(cfg, engine_tokens_per_s=2 * cfg.engine_tokens_per_s,
                          seq_tokens_per_s=2 * cfg.seq_tokens_per_s),
        "env pool": replace(cfg, env_workers=2 * cfg.env_workers),
        "weight sync": replace(cfg, publish_s=cfg.publish_s / 2, apply_s=cfg.apply_s / 2,
                               link_bytes_per_s=2 * cfg.link_bytes_per_s),
    }


def granularity(gpus: int) -> int:
    """Trainer sizes searched: every GPU count up to 64 GPUs, whole pairs of nodes above."""
    return 1 if gpus <= 64 else 16


def plan_row(name: str, base: SimConfig, gpus: int, full: bool = True) -> dict:
    """Size `base` on `gpus`; with `full`, also the pool it needs, the gain from doubling
    each input at the chosen split, and samples/s over seeds 0-3."""
    t0 = time.monotonic()
    plan = size_cluster(base, gpus, step=granularity(gpus),
                        pool_tolerance=0.02 if full else None)
    chosen = replace(base, trainer_gpus=plan.trainer_gpus, engines=plan.engines)
    r = plan.result
    blocked = chosen.publish_s + (link_seconds(chosen) if chosen.publish_waits_for_link else 0.0)
    row = {"config": name, "gpus": gpus, "prompts": base.prompts_per_step,
           "trainer_gpus": plan.trainer_gpus, "engines": plan.engines,
           "env_workers": base.env_workers, "env_workers_needed": plan.env_workers_needed,
           "samples_per_s": r.samples_per_s, "samples_per_s_per_gpu": r.samples_per_s / gpus,
           "seconds_per_step": r.seconds_per_step, "trainer_idle_frac": r.trainer_idle_frac,
           "engine_util": r.engine_util, "env_util": r.env_util, "env_wait_s": r.env_wait_s,
           "dropped": r.dropped, "staleness_mean": r.staleness_mean, "stalled": r.stalled,
           "train_s": train_seconds(chosen), "publish_blocked_s": blocked,
           "engine_apply_s": chosen.apply_s, "splits_tried": plan.tried}
    if full:
        gains = {k: simulate(c).samples_per_s / r.samples_per_s - 1 if r.samples_per_s else 0.0
                 for k, c in doubled(chosen).items()}
        row["gains_if_doubled"] = gains
        row["seeds_0_3_samples_per_s"] = [r.samples_per_s] + [
            simulate(replace(chosen, seed=s)).samples_per_s for s in (1, 2, 3)]
    row["sim_wall_s"] = time.monotonic() - t0
    return row


def sensitivity(name: str, base: SimConfig, gpus: int) -> list[dict]:
    """The configuration re-sized with one uncertain input changed."""
    cases = {"env latency x2": replace(base, env_median_s=2 * base.env_median_s),
             "decode / 2": replace(base, engine_tokens_per_s=base.engine_tokens_per_s / 2,
                                   seq_tokens_per_s=base.seq_tokens_per_s / 2),
             "training rate / 2": replace(
                 base, train_tokens_per_s_per_gpu=base.train_tokens_per_s_per_gpu / 2)}
    if "delta" in name:
        cases["delta codec on 8 cores"] = weights(base, "delta", "tcp", codec_cores=8)
    return [{**plan_row(name, cfg, gpus, full=False), "changed": what}
            for what, cfg in cases.items()]


def print_table(rows: list[dict]) -> None:
    print(f"{'GPUs':>4} {'prompts':>7}  {'configuration':44} {'T+E':>7} {'pool':>9} "
          f"{'samples/s':>9} {'seeds':>9} {'/GPU':>5} {'s/step':>6} {'idle':>4} {'eng':>4} "
          f"{'env':>4} {'drop':>4} {'stale':>5}  gain if doubled: trainer decode env sync")
    for r in rows:
        name = f"{r['config']}; {r['changed']}" if "changed" in r else r["config"]
        split = f"{r['trainer_gpus']}+{r['engines']}"
        pool = f"{r['env_workers_needed']}/{r['env_workers']}" if "gains_if_doubled" in r else "-"
        seeds = r.get("seeds_0_3_samples_per_s")
        seeds = f"{min(seeds):.0f}-{max(seeds):.0f}" if seeds else "-"
        gains = " ".join(f"{g:+.0%}" for g in r.get("gains_if_doubled", {}).values())
        print(f"{r['gpus']:4} {r['prompts']:7}  {name:44} {split:>7} {pool:>9} "
              f"{r['samples_per_s']:9.1f} {seeds:>9} {r['samples_per_s_per_gpu']:5.2f} "
              f"{r['seconds_per_step']:6.1f} {r['trainer_idle_frac']:4.0%} "
              f"{r['engine_util']:4.0%} {r['env_util']:4.0%} {r['dropped']:4} "
              f"{r['staleness_mean']:5.2f}  {gains}" + ("  STALLED" if r["stalled"] else ""))


def markdown(path: str) -> None:
    """The tables of a results file as markdown (docs/scale.md, BENCHMARKS.md)."""
    data = json.loads(Path(path).read_text())
    print("| GPUs | prompts x 16 | sync colocated | best async over tcp (100 Gbit/s) | x sync "
          "| async k=2 full over IB broadcast | x sync |")
    print("|---|---|---|---|---|---|---|")
    for gpus, prompts in dict.fromkeys((r["gpus"], r["prompts"]) for r in data["results"]):
        these = [r for r in data["results"] if (r["gpus"], r["prompts"]) == (gpus, prompts)]
        sync = next(r for r in these if r["config"].startswith("sync"))["samples_per_s"]
        tcp = max((r for r in these if r["config"].endswith("tcp")),
                  key=lambda r: r["samples_per_s"])
        ib = next(r for r in these if r["config"].endswith("ib"))
        print(f"| {gpus} | {prompts} | {sync:.1f} | {tcp['config']} ({tcp['trainer_gpus']} + "
              f"{tcp['engines']}): {tcp['samples_per_s']:.1f} | {tcp['samples_per_s'] / sync:.2f}"
              f" | ({ib['trainer_gpus']} + {ib['engines']}): {ib['samples_per_s']:.1f} "
              f"| {ib['samples_per_s'] / sync:.2f} |")
    print()
    print("| GPUs | prompts x 16 | configuration | trainer + engines | samples/s (seeds 0-3) "
          "| per GPU | s/step (train + publish) | trainer idle | engine util | env util "
          "| pool needed / given | dropped | gain if doubled: trainer / decode / env / sync |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in data["results"]:
        seeds = r["seeds_0_3_samples_per_s"]
        gains = " / ".join(f"{g:+.0%}" for g in r["gains_if_doubled"].values())
        print(f"| {r['gpus']} | {r['prompts']} | {r['config']} | {r['trainer_gpus']} + "
              f"{r['engines']} | {r['samples_per_s']:.1f} ({min(seeds):.1f}-{max(seeds):.1f}) "
              f"| {r['samples_per_s_per_gpu']:.2f} | {r['seconds_per_step']:.1f} "
              f"({r['train_s']:.1f} + {r['publish_blocked_s']:.1f}) "
              f"| {r['trainer_idle_frac']:.0%} | {r['engine_util']:.0%} | {r['env_util']:.0%} "
              f"| {r['env_workers_needed']} / {r['env_workers']} | {r['dropped']} | {gains} |")
    print()
    print("| GPUs | prompts x 16 | re-sized with | configuration | trainer + engines "
          "| samples/s | vs base | s/step | trainer idle | engine util |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = {(r["gpus"], r["prompts"], r["config"]): r["samples_per_s"] for r in data["results"]}
    for r in data["sensitivity"]:
        ref = base[(r["gpus"], r["prompts"], r["config"])]
        print(f"| {r['gpus']} | {r['prompts']} | {r['changed']} | {r['config']} "
              f"| {r['trainer_gpus']} + {r['engines']} | {r['samples_per_s']:.1f} "
              f"| {r['samples_per_s'] / ref - 1:+.0%} | {r['seconds_per_step']:.1f} "
              f"| {r['trainer_idle_frac']:.0%} | {r['engine_util']:.0%} |")
    print()
    print("| assumption | value | source |")
    print("|---|---|---|")
    for k, a in {**data["assumptions"], **data["measured_here"]}.items():
        print(f"| {k} | {a['value']:g} | {a['source']} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, nargs="*", default=[8, 64, 512])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--no-sensitivity", action="store_true")
    p.add_argument("--out", default=str(Path(__file__).parent / "results/scale_plan.json"))
    p.add_argument("--markdown", metavar="JSON", help="print a results file's tables as markdown")
    args = p.parse_args()
    if args.markdown:
        markdown(args.markdown)
        return
    results, sens = [], []
    scales = [(g, 8 * g) for g in args.gpus] + ([(512, 512)] if 512 in args.gpus else [])
    for gpus, prompts in scales:
        scale_rows = [plan_row(name, cfg, gpus) for name, cfg in rows(gpus, prompts, args.steps)]
        results += scale_rows
        print_table(scale_rows)
        if not args.no_sensitivity and prompts == 8 * gpus:
            configs = dict(rows(gpus, prompts, args.steps))
            best = max((r for r in scale_rows if r["config"].startswith("async")),
                       key=lambda r: r["samples_per_s"])
            these = sensitivity(best["config"], configs[best["config"]], gpus)
            if gpus == 512 and "delta" not in best["config"]:  # the codec's cost at scale
                delta = "async k=2, delta, tcp"
                these.append({**plan_row(delta, weights(configs[delta], "delta", "tcp", 8),
                                         gpus, full=False), "changed": "delta codec on 8 cores"})
            sens += these
            print_table(these)
        print(flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "args": vars(args), "workload": {"prompt_tokens": PROMPT_TOKENS,
                                         "completion_tokens": COMPLETION_TOKENS,
                                         "group_size": GROUP, "prompts_per_gpu": 8},
        "assumptions": {k: {"value": v, "source": s} for k, (v, s) in ASSUMPTIONS.items()},
        "measured_here": {k: {"value": v, "source": s} for k, (v, s) in MEASURED.items()},
        "base_config_64": asdict(rows(64, 512, args.steps)[0][1]),
        "results": results, "sensitivity": sens}, indent=1))


if __name__ == "__main__":
    main()
