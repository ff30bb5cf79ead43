"""Scale plan: the pipeline simulator (plan/simulate.py) sizing a 7B-class GRPO run on 8, 64
and 512 GPUs, sync against async, full against delta weight sync.

Workload (stated, not measured): a 7B-parameter policy (bf16 weights 14 GB), GRPO with 16
samples per prompt, 512-token prompts and 1024-token completions, a code-execution env whose
latency per sample is lognormal (median 1 s, sigma 0.99: p99 = 10x the median), cut at the
sandbox's 20 s wall limit, in a sandbox pool of 8 slots per GPU. The batch grows with the
cluster, 8 prompts per GPU (64, 512 and 4096 prompts x 16 samples at 8, 64 and 512 GPUs: the
same work per GPU per step, so the step time stays comparable; 512 x 16 at 64 GPUs is the
reference workload), plus a 512-GPU run at the fixed 512 x 16 batch. One optimizer step per RL step.

GPU-side rates are assumptions from published figures (traingym/plan/planner.py
GPU_PRESETS "h100", each with its source, used unscaled: they were measured on an 8B model;
docs/scale.md discusses them); the CPU-side costs of weight sync are the delta codec's
figures measured here: by default the ones `traingym plan` ships (src/traingym/plan/figures/
codec.json, written by benchmarks/plan_figures.py, which records when, where and at which commit),
or --codec-figures FILE (planner.codec_figures; the 2026-12-03 results used
benchmarks/results/weight_sync/2026-12-03-6e0ad4b-compress.json; BENCHMARKS.md "Weight sync").
The configurations, their weight-sync costs and the sizing are `traingym plan`'s
(plan/planner.py: planner.candidates, planner.size_row), per scale:
- sync: colocated (every GPU trains, then generates; trainer_gpus = engines = GPUs), full
  weights in place (the publisher's and the subscriber's hashes);
- async, staleness 1 and 2: the trainer/engine split searched by simulate.size_cluster (every
  trainer size up to 64 GPUs, steps of 16 at 512); weights full or delta over traingym's tcp
  transport (one sender whose 100 Gbit/s NIC every engine shares; publish blocked until all
  have it), or full over a broadcast on 400 Gbit/s InfiniBand ('dist', weights/dist.py with
  NCCL; staleness 2): the training loop cannot select 'dist', so those rows are marked not
  runnable (the config's reason) and never chosen as a best configuration.
For each chosen configuration: the smallest sandbox pool within 2% of the given pool's
samples/s, samples/s over seeds 0-3, and the gain in samples/s from doubling one input at
the chosen split (trainer rate, decode rates, env pool, the whole weight-sync cost). At a
balanced split no single doubling gains much; a large gain names what binds.
Sensitivity: the best runnable async configuration of each weak-scaled run re-sized with env
latency x2, decode rates / 2 and training rate / 2; at 512 GPUs also delta with the codec on 8
cores (parallel over tensors: not implemented, the measured one-core rate x 8).
Runs in about 11 minutes on one quiet core, 33 on two shared cores at load ~5 (512 GPUs
dominate: 65k env steps per simulated step).

    PYTHONPATH=src .venv/bin/python benchmarks/scale_plan.py   # -> benchmarks/results/scale_plan/
    PYTHONPATH=src .venv/bin/python benchmarks/scale_plan.py \
        --markdown benchmarks/results/scale_plan/2026-12-03-7832fc2.json   # its tables as markdown
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import resultfile
from traingym.plan import planner
from traingym.plan.simulate import SimConfig

GB = 1e9
H100 = planner.GPU_PRESETS["h100"]
CLUSTER = planner.TargetCluster()  # link defaults: 100 Gbit/s Ethernet, 400 Gbit/s InfiniBand
# name: (value, source). GPU-side figures are published, not measured here.
ASSUMPTIONS = {
    "params": (7e9, "7B-class policy (stated workload)"),
    "decode_tokens_per_s_per_gpu": H100["decode_tokens_per_s"],
    "seq_tokens_per_s": H100["seq_tokens_per_s"],
    "train_tokens_per_s_per_gpu": H100["train_tokens_per_s"],
    "allreduce_bytes_per_s_nvlink": H100["nvlink_bytes_per_s"],
    "allreduce_bytes_per_s_ib": H100["internode_bytes_per_s"],
    "tcp_link_bytes_per_s": (CLUSTER.nic_bytes_per_s, "100 Gbit/s Ethernet at line rate (the "
                             "trainer's NIC)"),
    "tcp_latency_s": (CLUSTER.tcp_latency_s, "TCP round trip on a datacenter network (order "
                      "of magnitude)"),
    "ib_link_bytes_per_s": (CLUSTER.ib_bytes_per_s, "400 Gbit/s InfiniBand at line rate"),
    "ib_latency_s": (CLUSTER.ib_latency_s, "InfiniBand (order of magnitude)"),
    "env_median_s": (1.0, "code execution with tests (stated workload, not measured)"),
    "env_sigma": (0.99, "lognormal sigma for p99 = 10x median: ln 10 / 2.326"),
    "env_timeout_s": (20.0, "traingym's sandbox wall limit (sandbox/base.py Limits.wall_s)"),
    "env_workers_per_gpu": (
        8, "one sandbox per CPU core, 64 of an 8-GPU node's 112 cores (2x Xeon 8480C, "
        "MLCommons H200-SXM-141GBx8 system description)"),
    "grad_bytes_per_param": (2, "bf16 gradients all-reduced (stated workload; traingym's "
                             "trainer keeps fp32 masters and would all-reduce 4)"),
}
A = {k: v for k, (v, _) in ASSUMPTIONS.items()}


def measured(codec: planner.CodecFigures) -> dict[str, tuple[float, str]]:
    """The delta codec's figures the plan uses, each with its source."""
    return {
        "delta_changed_fraction": (codec.changed_fraction, f"{codec.source}: SmolLM2-135M, "
                                   "lr 1e-6 (the tiered codec's run)"),
        "delta_bytes_per_changed": (codec.bytes_per_changed, f"{codec.source}: wire frame "
                                    "bytes per changed element"),
        "hash_bytes_per_s": (codec.hash_bytes_per_s, f"{codec.source}: xxh3-128 state hash"),
        "delta_encode_bytes_per_s": (codec.encode_bytes_per_s, f"{codec.source}: encode + "
                                     "target hash (publisher), one core, wall"),
        "delta_decode_bytes_per_s": (codec.decode_bytes_per_s, f"{codec.source}: decode + base "
                                     "re-hash + result hash (subscriber), one core, wall"),
    }


CODEC = planner.codec_figures()  # traingym's own: src/traingym/plan/figures/codec.json
MEASURED = measured(CODEC)
PROMPT_TOKENS, COMPLETION_TOKENS, GROUP = 512, 1024, 16


def cluster(gpus: int) -> planner.TargetCluster:
    """The H100 cluster with the preset's rates given as they are (measured on an 8B model,
    used for the 7B-class workload unscaled)."""
    return planner.check_cluster(planner.TargetCluster(
        gpus=gpus, decode_tokens_per_s=A["decode_tokens_per_s_per_gpu"],
        seq_tokens_per_s=A["seq_tokens_per_s"],
        train_tokens_per_s=A["train_tokens_per_s_per_gpu"],
        nvlink_bytes_per_s=A["allreduce_bytes_per_s_nvlink"],
        internode_bytes_per_s=A["allreduce_bytes_per_s_ib"]))


def workload(gpus: int, prompts: int) -> planner.Workload:
    return planner.Workload(
        params=A["params"], weight_bytes_per_param=2,
        grad_bytes_per_param=A["grad_bytes_per_param"], prompts_per_step=prompts,
        group_size=GROUP, prompt_tokens=PROMPT_TOKENS, completion_tokens=COMPLETION_TOKENS,
        env_median_s=A["env_median_s"], env_sigma=A["env_sigma"],
        env_timeout_s=A["env_timeout_s"], sandboxes=A["env_workers_per_gpu"] * gpus)


def rows(gpus: int, prompts: int, steps: int) -> list[tuple[str, SimConfig, str]]:
    """(name, simulator config, why not runnable) of each configuration compared."""
    c = cluster(gpus)
    return planner.candidates(workload(gpus, prompts), c, planner.rates(c, A["params"]), CODEC,
                              steps)


def plan_row(name: str, base: SimConfig, gpus: int, runnable: str = "",
             full: bool = True) -> dict:
    return asdict(planner.size_row(name, base, cluster(gpus), runnable, full))


def delta_on_cores(base: SimConfig, gpus: int, prompts: int, cores: int) -> SimConfig:
    """`base` with delta weights over tcp, the codec on `cores` cores."""
    return planner.with_weights(base, workload(gpus, prompts), cluster(gpus), CODEC, "delta",
                                "tcp", codec_cores=cores)


def sensitivity(name: str, base: SimConfig, gpus: int) -> list[dict]:
    """The configuration re-sized with one uncertain input changed."""
    cases = {"env latency x2": replace(base, env_median_s=2 * base.env_median_s),
             "decode / 2": replace(base, engine_tokens_per_s=base.engine_tokens_per_s / 2,
                                   seq_tokens_per_s=base.seq_tokens_per_s / 2),
             "training rate / 2": replace(
                 base, train_tokens_per_s_per_gpu=base.train_tokens_per_s_per_gpu / 2)}
    if "delta" in name:
        cases["delta codec on 8 cores"] = delta_on_cores(base, gpus, base.prompts_per_step, 8)
    return [{**plan_row(name, cfg, gpus, full=False), "changed": what}
            for what, cfg in cases.items()]


def print_table(rows: list[dict]) -> None:
    print(f"{'GPUs':>4} {'prompts':>7}  {'configuration':44} {'T+E':>7} {'pool':>9} "
          f"{'samples/s':>9} {'seeds':>9} {'/GPU':>5} {'s/step':>6} {'idle':>4} {'eng':>4} "
          f"{'env':>4} {'drop':>4} {'stale':>5}  gain if doubled: trainer decode env sync")
    for r in rows:
        name = f"{r['config']}; {r['changed']}" if "changed" in r else r["config"]
        split = f"{r['trainer_gpus']}+{r['engines']}"
        pool = f"{r['env_workers_needed']}/{r['env_workers']}" if r["gains_if_doubled"] else "-"
        seeds = r.get("seeds_0_3_samples_per_s")
        seeds = f"{min(seeds):.0f}-{max(seeds):.0f}" if seeds else "-"
        gains = " ".join(f"{g:+.0%}" for g in (r["gains_if_doubled"] or {}).values())
        print(f"{r['gpus']:4} {r['prompts']:7}  {name:44} {split:>7} {pool:>9} "
              f"{r['samples_per_s']:9.1f} {seeds:>9} {r['samples_per_s_per_gpu']:5.2f} "
              f"{r['seconds_per_step']:6.1f} {r['trainer_idle_frac']:4.0%} "
              f"{r['engine_util']:4.0%} {r['env_util']:4.0%} {r['dropped']:4} "
              f"{r['staleness_mean']:5.2f}  {gains}" + ("  STALLED" if r["stalled"] else "")
              + ("  NOT YET RUNNABLE" if r["runnable"] else ""))


def markdown(path: str) -> None:
    """The tables of a results file as markdown (docs/scale.md, BENCHMARKS.md)."""
    data = json.loads(Path(path).read_text())
    print("| GPUs | prompts x 16 | sync colocated | best runnable async: over tcp (100 Gbit/s) "
          "| x sync | not yet runnable: async k=2 full over IB broadcast ('dist') | x sync |")
    print("|---|---|---|---|---|---|---|")
    for gpus, prompts in dict.fromkeys((r["gpus"], r["prompts"]) for r in data["results"]):
        these = [r for r in data["results"] if (r["gpus"], r["prompts"]) == (gpus, prompts)]
        sync = next(r for r in these if r["config"].startswith("sync"))["samples_per_s"]
        tcp = max((r for r in these if r["config"].startswith("async") and not r["runnable"]),
                  key=lambda r: r["samples_per_s"])
        ib = next(r for r in these if r["config"].endswith("dist"))
        print(f"| {gpus} | {prompts} | {sync:.1f} | {tcp['config']} ({tcp['trainer_gpus']} + "
              f"{tcp['engines']}): {tcp['samples_per_s']:.1f} | {tcp['samples_per_s'] / sync:.2f}"
              f" | ({ib['trainer_gpus']} + {ib['engines']}): {ib['samples_per_s']:.1f} "
              f"| {ib['samples_per_s'] / sync:.2f} |")
    print()
    print("| GPUs | prompts x 16 | configuration | runnable | trainer + engines "
          "| samples/s (seeds 0-3) "
          "| per GPU | s/step (train + publish) | trainer idle | engine util | env util "
          "| pool needed / given | dropped | gain if doubled: trainer / decode / env / sync |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in data["results"]:
        seeds = r["seeds_0_3_samples_per_s"]
        gains = " / ".join(f"{g:+.0%}" for g in r["gains_if_doubled"].values())
        print(f"| {r['gpus']} | {r['prompts']} | {r['config']} "
              f"| {'not yet' if r['runnable'] else 'yes'} | {r['trainer_gpus']} + "
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
    resultfile.add_args(p)
    p.add_argument("--markdown", metavar="JSON", help="print a results file's tables as markdown")
    p.add_argument("--codec-figures", metavar="JSON", help="the delta codec's figures "
                   "(default: traingym's own, src/traingym/plan/figures/codec.json)")
    args = p.parse_args()
    if args.markdown:
        markdown(args.markdown)
        return
    rec = resultfile.start("scale_plan", args)
    if args.codec_figures:
        global CODEC, MEASURED
        CODEC = planner.codec_figures(args.codec_figures)
        MEASURED = measured(CODEC)
    results, sens = [], []
    scales = [(g, 8 * g) for g in args.gpus] + ([(512, 512)] if 512 in args.gpus else [])
    for gpus, prompts in scales:
        scale_rows = [plan_row(name, cfg, gpus, why)
                      for name, cfg, why in rows(gpus, prompts, args.steps)]
        results += scale_rows
        print_table(scale_rows)
        if not args.no_sensitivity and prompts == 8 * gpus:
            configs = {name: cfg for name, cfg, _ in rows(gpus, prompts, args.steps)}
            best = max((r for r in scale_rows  # runnable rows only: never 'dist'
                        if r["config"].startswith("async") and not r["runnable"]),
                       key=lambda r: r["samples_per_s"])
            these = sensitivity(best["config"], configs[best["config"]], gpus)
            if gpus == 512 and "delta" not in best["config"]:  # the codec's cost at scale
                delta = "async k=2, delta, tcp"
                these.append({**plan_row(delta, delta_on_cores(configs[delta], gpus, prompts, 8),
                                         gpus, full=False), "changed": "delta codec on 8 cores"})
            sens += these
            print_table(these)
        print(flush=True)
    rec.write({
        "args": vars(args), "workload": {"prompt_tokens": PROMPT_TOKENS,
                                         "completion_tokens": COMPLETION_TOKENS,
                                         "group_size": GROUP, "prompts_per_gpu": 8},
        "assumptions": {k: {"value": v, "source": s} for k, (v, s) in ASSUMPTIONS.items()},
        "measured_here": {k: {"value": v, "source": s} for k, (v, s) in MEASURED.items()},
        "base_config_64": asdict(rows(64, 512, args.steps)[0][1]),
        "results": results, "sensitivity": sens})


if __name__ == "__main__":
    main()
