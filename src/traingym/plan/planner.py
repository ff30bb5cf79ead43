"""The plan behind `traingym plan` (plan/cli.py): the target cluster and its rates, one RL step
(Workload), the delta codec's figures, and candidate configurations (sync colocated; async at
staleness 1, 2 and the config's own; full or delta weights over tcp; a 'dist' broadcast for
reference), each sized by plan/simulate.py's size_cluster. Rows whose transport the config
rejects are marked not runnable, and the best is chosen among runnable rows only.
Limits: GPU preset rates are published 8B-on-H100 figures scaled by REFERENCE_PARAMS / params
(a mixture of experts: its active parameters, those a token runs; FLOPs, not MoE dispatch),
far too high below 1B parameters (pass measured rates); ideal scaling across gpus_per_engine;
codec rates are one core's, measured on one machine (plan/figures/codec.json says which, when
and at which commit; benchmarks/plan_figures.py measures them again). traingym's trainer and
built-in engine run on CPU, so the plan predicts the pipeline's rules at GPU rates, not a run
placed on GPUs. See also
plan/simulate.py's limits. Imports are late because `traingym --help` imports plan/cli.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from traingym.plan.simulate import SimConfig, link_seconds, simulate, size_cluster, train_seconds

GB = 1e9
REFERENCE_PARAMS = 8.03e9  # Llama 3.1 8B, the model the presets' token rates were measured on
# name -> field -> (value, source). Token rates per GPU for the reference model; bandwidths
# in bytes/s per GPU.
GPU_PRESETS: dict[str, dict[str, tuple[float, str]]] = {
    "h100": {
        "decode_tokens_per_s": (
            8000.0, "vLLM v0.6.0, Llama 3.1 8B, 1x H100, 256 concurrent sequences: 8,088 "
            "output tokens/s (LambdaLabsML/vllm-benchmark, benchmark_v0.md)"),
        "seq_tokens_per_s": (
            150.0, "one sequence alone, bf16 8B on H100: 75 tokens/s measured on an A100 40GB "
            "(johnmusgrave.com vLLM sweep, 77% of its HBM roofline) x 2.2 (H100 SXM 3.35 TB/s "
            "vs 1.55 TB/s); NVIDIA NIM lists 214 tokens/s at concurrency 1"),
        "train_tokens_per_s": (
            5000.0, "torchtitan docs/performance.md: Llama 3.1 8B, 8x H100, FSDP + "
            "torch.compile, bf16: 6,667 tokens/s/GPU; x 3/4 for the reference model's "
            "forward (KL)"),
        "nvlink_bytes_per_s": (
            450 * GB, "8x H100 SXM NVLink all-reduce busbw 460-480 GB/s (nccl-tests "
            "reference, docs.alayanew.com); trainer within one node"),
        "internode_bytes_per_s": (
            40 * GB, "400 Gbit/s per GPU (torchtitan's H100 cluster; Dell XE9680 8x 400Gb IB, "
            "MLCommons) = 50 GB/s, 80% of it; trainer over several nodes"),
    },
}
SCALED = ("decode_tokens_per_s", "seq_tokens_per_s", "train_tokens_per_s")
# the delta codec's figures shipped with traingym (package data), written by
# benchmarks/plan_figures.py; `traingym plan --codec-figures FILE` reads another file instead
CODEC_FIGURES = "figures/codec.json"


@dataclass(frozen=True)
class TargetCluster:
    """The cluster to plan for. A rate left at 0 comes from the `gpu` preset (token rates
    scaled to the model); a rate given is used as it is, for this model."""

    gpus: int = 0  # required
    gpu: str = "h100"
    node_gpus: int = 8
    gpus_per_engine: int = 1
    decode_tokens_per_s: float = 0.0
    seq_tokens_per_s: float = 0.0
    train_tokens_per_s: float = 0.0
    nvlink_bytes_per_s: float = 0.0
    internode_bytes_per_s: float = 0.0
    nic_bytes_per_s: float = 12.5 * GB
    tcp_latency_s: float = 50e-6
    ib_bytes_per_s: float = 50 * GB
    ib_latency_s: float = 5e-6
    sandboxes: int = -1


@dataclass(frozen=True)
class Rates:
    decode_tokens_per_s: float
    seq_tokens_per_s: float
    train_tokens_per_s: float
    nvlink_bytes_per_s: float
    internode_bytes_per_s: float
    source: dict[str, str]  # field -> where its value came from


@dataclass(frozen=True)
class Workload:
    """One RL step of the run, as the simulator needs it."""

    params: float
    weight_bytes_per_param: int  # on the wire: the engine's dtype
    grad_bytes_per_param: int  # all-reduced by the trainer
    prompts_per_step: int
    group_size: int
    prompt_tokens: int
    completion_tokens: int
    env_median_s: float
    env_sigma: float  # lognormal sigma
    env_timeout_s: float  # 0: no cut
    sandboxes: int  # env slots; 0: unlimited
    active_params: float = 0.0  # a mixture of experts: those a token runs (0: all, dense);
    # token rates scale with it, weights, gradients and memory with `params`


@dataclass(frozen=True)
class CodecFigures:
    """The delta codec as measured (benchmarks/weight_sync.py), one core."""

    changed_fraction: float
    bytes_per_changed: float  # wire frame bytes per changed element
    encode_bytes_per_s: float  # encode + target hash (the publisher), of model bytes
    decode_bytes_per_s: float  # decode + base re-hash + result hash (each subscriber)
    hash_bytes_per_s: float  # xxh3-128 of the state (a full update, each side)
    source: str


@dataclass
class Row:
    """One configuration, sized on the cluster (JSON-ready)."""

    config: str
    runnable: str  # "" or why the loop cannot run it
    gpus: int
    prompts: int
    trainer_gpus: int
    engines: int
    env_workers: int
    env_workers_needed: int
    samples_per_s: float
    samples_per_s_per_gpu: float
    seconds_per_step: float
    trainer_idle_frac: float
    engine_util: float
    env_util: float
    env_wait_s: float
    dropped: int
    staleness_mean: float
    stalled: bool
    train_s: float
    publish_blocked_s: float
    engine_apply_s: float
    splits_tried: list
    gains_if_doubled: dict[str, float] | None = None
    seeds_0_3_samples_per_s: list[float] | None = None
    sim_wall_s: float = 0.0


def bad(message: str):
    """A ConfigError (imported late: traingym.config.schema imports pydantic)."""
    from traingym.core.errors import ConfigError  # heavy: pydantic

    return ConfigError(message)


def check_cluster(c: TargetCluster) -> TargetCluster:
    """Fail on values that cannot describe a cluster, naming the flag."""
    if c.gpu not in GPU_PRESETS:
        raise bad(f"--gpu {c.gpu!r}: no preset; choose one of {sorted(GPU_PRESETS)}, or give "
                  "every rate (--decode-tokens-per-s, --seq-tokens-per-s, "
                  "--train-tokens-per-s, --nvlink-bytes-per-s, --internode-bytes-per-s) "
                  "with --gpu h100")
    if not c.gpus:
        raise bad("traingym plan needs the target's GPU count: --gpus N (or gpus = N in "
                  "the --cluster file)")
    for f in fields(c):
        v = getattr(c, f.name)
        low = 1 if f.name in ("gpus", "node_gpus", "gpus_per_engine") else 0
        if f.name != "gpu" and not (v >= low if f.name != "sandboxes" else v >= -1):
            raise bad(f"--{f.name.replace('_', '-')} {v}: must be >= {low}")
    if c.gpus < c.gpus_per_engine:
        raise bad(f"--gpus {c.gpus} is fewer than --gpus-per-engine {c.gpus_per_engine}")
    return c


def rates(c: TargetCluster, params: float) -> Rates:
    """The cluster's rates for a model of `params`: given ones as they are, the preset's
    token rates x REFERENCE_PARAMS / params."""
    out, source = {}, {}
    for name, (value, src) in GPU_PRESETS[c.gpu].items():
        given = getattr(c, name)
        if given:
            out[name], source[name] = given, "given"
        elif name in SCALED:
            out[name] = value * REFERENCE_PARAMS / params
            source[name] = (f"{c.gpu} preset {value:g} x {REFERENCE_PARAMS:.3g} / "
                            f"{params:.4g} params")
        else:
            out[name], source[name] = value, f"{c.gpu} preset"
    return Rates(**out, source=source)


def codec_figures(path: str | Path | None = None) -> CodecFigures:
    """The delta codec's figures: by default the package's own (plan/figures/codec.json, written
    by benchmarks/plan_figures.py), so an installed traingym needs no source checkout; `path`
    reads another file, either one of those or a result file of
    `benchmarks/weight_sync.py --sections compress,throughput` (wall-clock rates)."""
    import json

    if path is None:
        from importlib import resources

        shipped = resources.files("traingym.plan").joinpath(CODEC_FIGURES)
        name, text = f"traingym/plan/{CODEC_FIGURES}", shipped.read_text()
    else:
        path = Path(path)
        if not path.is_file():
            raise bad(f"codec figures: {path} does not exist; pass a file written by "
                      "benchmarks/plan_figures.py or benchmarks/weight_sync.py --sections "
                      "compress,throughput (or leave --codec-figures out: traingym's own)")
        name, text = str(path), path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad(f"codec figures: {name} is not JSON: {e}") from None
    if isinstance(data, dict) and "figures" in data:
        return _shipped_figures(data, name)
    return weight_sync_figures(data, name)


def _shipped_figures(data: dict, name: str) -> CodecFigures:
    """A figures file of benchmarks/plan_figures.py: {"figures": {CodecFigures' rates}, ...}."""
    try:
        f = data["figures"]
        prov = data.get("provenance", {})
        when = (prov.get("started") or "")[:10]
        at = f" at {prov['commit'][:7]}" if prov.get("commit") else ""
        return CodecFigures(**{k: float(f[k]) for k in (
            "changed_fraction", "bytes_per_changed", "encode_bytes_per_s", "decode_bytes_per_s",
            "hash_bytes_per_s")}, source=f"{name}, {when}{at}".rstrip(", "))
    except (KeyError, TypeError, ValueError) as e:
        raise bad(f"codec figures: {name} lacks {e} (a figures file of "
                  "benchmarks/plan_figures.py has figures.changed_fraction, "
                  "bytes_per_changed, encode_, decode_ and hash_bytes_per_s)") from None


def weight_sync_figures(data: dict, name: str) -> CodecFigures:
    """The figures at the step benchmarks/weight_sync.py timed, from its result (the compress
    and throughput sections; wall-clock rates)."""
    try:
        step = data["timed_step"]
        sizes = data["compress"]["steps"][step - 1]
        wall = data["throughput"]["wall"]
        figures = CodecFigures(
            changed_fraction=sizes["density"],
            bytes_per_changed=sizes["traingym_frame"] / sizes["changed"],
            encode_bytes_per_s=wall["encode_with_hash_GBps"] * GB,
            decode_bytes_per_s=wall["decode_with_2_hashes_GBps"] * GB,
            hash_bytes_per_s=wall["hash_GBps"] * GB,
            source=f"{Path(name).name}, step {step}")
        density = data["throughput"]["density"]
    except (KeyError, IndexError, TypeError) as e:
        raise bad(f"codec figures: {name} lacks {e} (it needs both the compress and the "
                  "throughput sections of benchmarks/weight_sync.py)") from None
    if abs(figures.changed_fraction - density) > 1e-12:
        raise bad(f"codec figures: {name}: the throughput was timed at another step than "
                  "the sizes (density differs)")
    return figures


def base_config(w: Workload, c: TargetCluster, r: Rates, mode: str, staleness: int,
                steps: int, seed: int = 0):
    """The simulator's config for one step of `w` on `c` (split and weights set later)."""

    return SimConfig(
        steps=steps, warmup=4, prompts_per_step=w.prompts_per_step, group_size=w.group_size,
        mode=mode, max_staleness=staleness, gen_fixed_s=0.0, gen_row_s=0.0,
        completion_tokens=w.completion_tokens,
        engine_tokens_per_s=r.decode_tokens_per_s * c.gpus_per_engine,
        seq_tokens_per_s=r.seq_tokens_per_s * c.gpus_per_engine,
        env_median_s=w.env_median_s, env_sigma=w.env_sigma, env_timeout_s=w.env_timeout_s,
        env_workers=w.sandboxes, train_s=0.0,
        train_tokens_per_sample=w.prompt_tokens + w.completion_tokens,
        train_tokens_per_s_per_gpu=r.train_tokens_per_s,
        grad_bytes=w.grad_bytes_per_param * w.params, node_gpus=c.node_gpus,
        allreduce_bytes_per_s=r.nvlink_bytes_per_s,
        internode_bytes_per_s=r.internode_bytes_per_s, seed=seed)


def with_weights(cfg, w: Workload, c: TargetCluster, f: CodecFigures, codec: str, link: str,
                 codec_cores: int = 1):
    """Publish (trainer blocked), wire bytes and engine apply of `codec` over `link`:
    'local' (colocated, in place), 'tcp' (one sender; every engine shares its NIC; publish
    blocks until all have it, as TcpSender.send) or 'dist' (a pipelined broadcast tree)."""
    from dataclasses import replace

    state = w.weight_bytes_per_param * w.params
    if codec == "full":
        wire, publish, apply = state, state / f.hash_bytes_per_s, state / f.hash_bytes_per_s
    else:
        wire = w.params * f.changed_fraction * f.bytes_per_changed
        publish = state / (f.encode_bytes_per_s * codec_cores)
        apply = state / (f.decode_bytes_per_s * codec_cores)
    if link == "local":
        return replace(cfg, publish_s=publish, apply_s=apply, weight_bytes=0.0)
    rate, latency, fanout = {"tcp": (c.nic_bytes_per_s, c.tcp_latency_s, "sender"),
                             "dist": (c.ib_bytes_per_s, c.ib_latency_s, "broadcast")}[link]
    return replace(cfg, publish_s=publish, apply_s=apply, weight_bytes=wire,
                   link_bytes_per_s=rate, link_latency_s=latency, fanout=fanout,
                   publish_waits_for_link=True)


def not_runnable(link: str) -> str:
    """Why the training loop cannot run weights over `link` across nodes ("" if it can):
    the reason the config itself gives (sync: inproc; async over tcp or dist: on Ray)."""
    from traingym.config.load import validate  # heavy: pydantic, safetensors, torch
    from traingym.core.errors import ConfigError  # heavy: pydantic

    data = ({"mode": "sync", "weights": {"transport": "inproc"}} if link == "local" else
            {"mode": "async", "weights": {"transport": link},
             "cluster": {"type": "ray", "address": "auto"}})
    try:
        validate(data)
    except ConfigError as e:
        return str(e).split("\n")[0].removeprefix("invalid config: ")
    return ""


def candidates(w: Workload, c: TargetCluster, r: Rates, f: CodecFigures, steps: int,
               stalenesses: tuple[int, ...] = (1, 2)) -> list[tuple[str, Any, str]]:
    """(name, simulator config, why not runnable or "") of every configuration compared."""
    out = [("sync, colocated", with_weights(base_config(w, c, r, "sync", 0, steps), w, c, f,
                                            "full", "local"), not_runnable("local"))]
    if c.gpus < 1 + c.gpus_per_engine:
        return out
    for k in stalenesses:
        for codec in ("full", "delta"):
            out.append((f"async k={k}, {codec}, tcp", with_weights(
                base_config(w, c, r, "async", k, steps), w, c, f, codec, "tcp"),
                not_runnable("tcp")))
    k = max(stalenesses)
    out.append((f"async k={k}, full, dist", with_weights(
        base_config(w, c, r, "async", k, steps), w, c, f, "full", "dist"),
        not_runnable("dist")))
    return out


def doubled(cfg) -> dict[str, Any]:
    """The configuration with one input twice as fast (what binds at a split)."""
    from dataclasses import replace

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


def split_step(c: TargetCluster) -> int:
    """Trainer sizes searched: every GPU count up to 64 GPUs, two nodes at a time above."""
    return 1 if c.gpus <= 64 else 2 * c.node_gpus


def size_row(name: str, base, c: TargetCluster, runnable: str = "", full: bool = True) -> Row:
    """Size `base` on the cluster (simulate.size_cluster); with `full`, also the sandbox pool
    it needs, the gain from doubling each input at the chosen split, and seeds 0-3."""
    import time
    from dataclasses import replace

    t0 = time.monotonic()
    plan = size_cluster(base, c.gpus, step=split_step(c), gpus_per_engine=c.gpus_per_engine,
                        pool_tolerance=0.02 if full else None)
    chosen = replace(base, trainer_gpus=plan.trainer_gpus, engines=plan.engines)
    res = plan.result
    blocked = chosen.publish_s + (link_seconds(chosen) if chosen.publish_waits_for_link else 0)
    row = Row(name, runnable, c.gpus, base.prompts_per_step, plan.trainer_gpus, plan.engines,
              base.env_workers, plan.env_workers_needed, res.samples_per_s,
              res.samples_per_s / c.gpus, res.seconds_per_step, res.trainer_idle_frac,
              res.engine_util, res.env_util, res.env_wait_s, res.dropped, res.staleness_mean,
              res.stalled, train_seconds(chosen), blocked, chosen.apply_s, list(plan.tried))
    if full:
        row.gains_if_doubled = {
            k: simulate(x).samples_per_s / res.samples_per_s - 1 if res.samples_per_s else 0.0
            for k, x in doubled(chosen).items()}
        row.seeds_0_3_samples_per_s = [res.samples_per_s] + [
            simulate(replace(chosen, seed=s)).samples_per_s for s in (1, 2, 3)]
    row.sim_wall_s = time.monotonic() - t0
    return row


def best(rows: list[Row]) -> Row | None:
    """The runnable row with the most trained samples/s."""
    ok = [r for r in rows if not r.runnable and not r.stalled]
    return max(ok, key=lambda r: r.samples_per_s) if ok else None
