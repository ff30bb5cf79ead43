"""`traingym plan`: what a run's config would do on a target GPU cluster, predicted by the
pipeline simulator (cluster/simulate.py) before any cluster time is spent.

Inputs, and where each comes from:
- the traingym config: the model's size (model.path: 'tiny', 'embedded' or a Hugging Face
  folder's config.json, counted on torch's meta device, no weights loaded), the weights'
  wire dtype (model.engine_dtype), prompts_per_step x group_size, rollout.max_new_tokens
  (every completion is taken to be that long: an upper bound unless rollout.ignore_eos),
  whether the task runs an env (task.env) or a reward function, and cluster.sandbox_workers;
- flags (what a config cannot know): the target cluster (TargetCluster: GPUs, a GPU preset or
  measured rates, links, sandbox pool), the prompt length, the env latency (median, p99, cut);
- the delta codec's figures measured by benchmarks/weight_sync.py (bytes per changed element
  with the wire frame, encode + target hash and decode + two hashes on one core, the state
  hash), read from its result file (`codec_figures`).
Configurations compared (`candidates`): sync colocated (every GPU trains, then generates;
weights in place) and async at max staleness 1 and 2 (and the config's own), each with full
and delta weights fanned out over tcp by one sender, plus full weights over an InfiniBand
broadcast ('dist', weights/dist.py), shown for reference: a row whose transport the config
rejects for that mode is marked not runnable with the config's reason, and the best
configuration is chosen among runnable rows only. For each row simulate.size_cluster picks
the trainer/engine split and the smallest sandbox pool within 2% of the given pool's rate.

Limits: the GPU preset's rates are published figures for an 8B model on H100 (GPU_PRESETS,
each with its source), scaled by REFERENCE_PARAMS / params to the config's model (compute and
memory traffic per token grow with the parameters); far below 1B parameters fixed overheads
dominate and the scaled rates are far too high: pass measured rates. The trainer's
gradients are all-reduced in fp32 (traingym keeps fp32 master weights), the engines use
gpus_per_engine GPUs each with ideal scaling, the codec's rates are one core of the machine
that measured them at its measured changed fraction (learning rate and model dependent).
traingym's trainer and built-in engine run on CPU today: the plan predicts the pipeline's
rules (admission, staleness bound, weight sync, sandbox pool) at GPU rates, not a run that
this version of traingym places on GPUs. Everything simulate.py leaves out (its docstring).
Imports are late: this module is imported by `traingym --help`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

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
CODEC_FIGURES = Path(__file__).resolve().parents[2] / "benchmarks/results/weight_sync_compress.json"


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


HELP = {
    "gpus": "GPUs of the cluster (trainer + engines)",
    "gpu": f"GPU preset for the rates not given: {sorted(GPU_PRESETS)}",
    "node_gpus": "GPUs per node (the trainer's all-reduce leaves NVLink beyond one node)",
    "gpus_per_engine": "GPUs per rollout engine (tensor parallel; rates scale ideally)",
    "decode_tokens_per_s": "one GPU's decode rate at full batch, for this model (measured)",
    "seq_tokens_per_s": "one sequence's decode rate alone on one GPU, for this model",
    "train_tokens_per_s": "training tokens/s per GPU, for this model (forward + backward)",
    "nvlink_bytes_per_s": "all-reduce bus bandwidth per GPU within a node",
    "internode_bytes_per_s": "all-reduce bus bandwidth per GPU across nodes",
    "nic_bytes_per_s": "the trainer's NIC, shared by every engine in tcp's fan-out "
                       "(default 100 Gbit/s)",
    "tcp_latency_s": "tcp latency between nodes",
    "ib_bytes_per_s": "InfiniBand link rate of the 'dist' broadcast (default 400 Gbit/s)",
    "ib_latency_s": "InfiniBand latency",
    "sandboxes": "sandbox (env) slots of the cluster; default: cluster.sandbox_workers of the "
                 "config if set, else 8 per GPU when the task runs an env, else unlimited (0)",
}


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


def _bad(message: str):
    from traingym.config import ConfigError

    return ConfigError(message)


def check_cluster(c: TargetCluster) -> TargetCluster:
    """Fail on values that cannot describe a cluster, naming the flag."""
    if c.gpu not in GPU_PRESETS:
        raise _bad(f"--gpu {c.gpu!r}: no preset; choose one of {sorted(GPU_PRESETS)}, or give "
                   "every rate (--decode-tokens-per-s, --seq-tokens-per-s, "
                   "--train-tokens-per-s, --nvlink-bytes-per-s, --internode-bytes-per-s) "
                   "with --gpu h100")
    if not c.gpus:
        raise _bad("traingym plan needs the target's GPU count: --gpus N (or gpus = N in "
                   "the --cluster file)")
    for f in fields(c):
        v = getattr(c, f.name)
        low = 1 if f.name in ("gpus", "node_gpus", "gpus_per_engine") else 0
        if f.name != "gpu" and not (v >= low if f.name != "sandboxes" else v >= -1):
            raise _bad(f"--{f.name.replace('_', '-')} {v}: must be >= {low}")
    if c.gpus < c.gpus_per_engine:
        raise _bad(f"--gpus {c.gpus} is fewer than --gpus-per-engine {c.gpus_per_engine}")
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
    """The delta codec's figures at the step the benchmark timed, from the result file of
    `benchmarks/weight_sync.py --sections compress,throughput` (wall-clock rates)."""
    import json

    path = Path(path) if path else CODEC_FIGURES
    if not path.is_file():
        raise _bad(f"codec figures: {path} does not exist (a source checkout has it); pass "
                   "--codec-figures FILE written by benchmarks/weight_sync.py --sections "
                   "compress,throughput")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise _bad(f"codec figures: {path} is not JSON: {e}") from None
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
            source=f"{path.name}, step {step}")
    except (KeyError, IndexError, TypeError) as e:
        raise _bad(f"codec figures: {path} lacks {e} (it needs both the compress and the "
                   "throughput sections of benchmarks/weight_sync.py)") from None
    if abs(figures.changed_fraction - data["throughput"]["density"]) > 1e-12:
        raise _bad(f"codec figures: {path}: the throughput was timed at another step than "
                   "the sizes (density differs)")
    return figures


def model_params(path: str) -> int:
    """Parameters of model.path (tied weights once), from its config only."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if path == "tiny":
        from traingym.models.loader import tiny_model, tiny_tokenizer

        model = tiny_model(tiny_tokenizer())
    else:
        if path == "embedded":
            from traingym.models.embedded import EMBEDDED_NAME, cache_dir, gguf_path

            folder = cache_dir() / "models" / EMBEDDED_NAME
            if (folder / "config.json").is_file():
                config = AutoConfig.from_pretrained(folder)
            else:  # the GGUF file's metadata: no dequantisation
                src = gguf_path()
                config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
        else:
            folder = Path(path).expanduser()
            if not (folder / "config.json").is_file():
                raise _bad(f"model.path={path!r}: not a Hugging Face model folder (no "
                           "config.json); use 'embedded', 'tiny', or a local folder")
            config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def env_sigma(median_s: float, p99_s: float) -> float:
    """Lognormal sigma with the given median and 99th percentile."""
    return math.log(p99_s / median_s) / 2.3263478740408408 if median_s and p99_s else 0.0


def base_config(w: Workload, c: TargetCluster, r: Rates, mode: str, staleness: int,
                steps: int, seed: int = 0):
    """The simulator's config for one step of `w` on `c` (split and weights set later)."""
    from traingym.cluster.simulate import SimConfig

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
    from traingym.config import ConfigError, validate

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

    from traingym.cluster.simulate import link_seconds, simulate, size_cluster, train_seconds

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


# --- the command ---


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "plan", help="predict step time, utilisation and the GPU split of a config on a "
        "target cluster (simulated)", description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", help="TOML, YAML or JSON config file")
    p.add_argument("--preset", default="default", help="default | tiny")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set rollout.prompts_per_step=512")
    p.add_argument("--cluster", metavar="TOML", help="a file of the target cluster's keys "
                   "(the flags below without '--', '_' for '-'); flags override it")
    for f in fields(TargetCluster):
        kind = str if f.name == "gpu" else int if f.type in ("int", int) else float
        default = ("required" if f.name == "gpus" else "" if f.name == "sandboxes" else
                   "the --gpu preset's" if f.name in GPU_PRESETS["h100"] else f.default)
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cluster_{f.name}", type=kind,
                       default=None, metavar=kind.__name__.upper(),
                       help=HELP[f.name] + (f" (default: {default})" if default != "" else ""))
    p.add_argument("--prompt-tokens", type=int, default=None, help="mean prompt tokens (a "
                   "config does not know them; the default 256 is a guess: measure yours)")
    p.add_argument("--completion-tokens", type=int, default=None, help="mean completion "
                   "tokens (default rollout.max_new_tokens: an upper bound)")
    p.add_argument("--env-median-s", type=float, default=None, help="median env step "
                   "latency (required when the task runs an env; a reward function: 0)")
    p.add_argument("--env-p99-s", type=float, default=None,
                   help="99th percentile of the env step latency (default: the median)")
    p.add_argument("--env-timeout-s", type=float, default=None, help="an env step is cut "
                   "here (default: the sandbox's wall limit, sandbox/base.py Limits.wall_s)")
    p.add_argument("--codec-figures", metavar="JSON", help=f"weight_sync.py result file "
                   f"(default {CODEC_FIGURES.relative_to(CODEC_FIGURES.parents[2])})")
    p.add_argument("--sim-steps", type=int, default=20, help="simulated steps (4 warm-up)")


def target_cluster(args) -> TargetCluster:
    """The cluster from --cluster's file, then the flags."""
    import difflib
    import tomllib
    from dataclasses import replace

    c = TargetCluster()
    names = [f.name for f in fields(TargetCluster)]
    if args.cluster:
        path = Path(args.cluster)
        if not path.is_file():
            raise _bad(f"--cluster {path}: no such file")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise _bad(f"--cluster {path}: not TOML: {e}") from None
        for key, value in data.items():
            if key not in names:
                near = difflib.get_close_matches(key, names, 1)
                raise _bad(f"--cluster {path}: unknown key {key!r}"
                           + (f"; did you mean {near[0]!r}?" if near else f"; keys: {names}"))
            want = type(getattr(c, key))
            if not isinstance(value, (int, float, str)) or isinstance(value, bool) or (
                    want is str) != isinstance(value, str) or (
                    want is int and not isinstance(value, int)):
                raise _bad(f"--cluster {path}: {key} = {value!r}: expected {want.__name__}")
            c = replace(c, **{key: want(value)})
    given = {n: getattr(args, f"cluster_{n}") for n in names}
    return check_cluster(replace(c, **{n: v for n, v in given.items() if v is not None}))


def workload(cfg, args, cluster: TargetCluster, params: int) -> Workload:
    """The run's step from its config and the flags; fails when the config runs an env and
    no latency is given."""
    from traingym.sandbox.base import Limits

    runs_env = cfg.task.env is not None
    if runs_env and args.env_median_s is None:
        raise _bad(f"the config's task.env ({cfg.task.env}) runs an environment whose latency "
                   "a config cannot know: pass --env-median-s (and --env-p99-s)")
    median = args.env_median_s or 0.0
    p99 = args.env_p99_s if args.env_p99_s is not None else median
    if median < 0 or p99 < median:
        raise _bad(f"--env-median-s {median} / --env-p99-s {p99}: need 0 <= median <= p99")
    if median == 0 and p99 > 0:
        raise _bad("--env-p99-s needs --env-median-s > 0")
    sandboxes = cluster.sandboxes
    if sandboxes == -1:
        sandboxes = cfg.cluster.sandbox_workers or (8 * cluster.gpus if runs_env else 0)
    for flag in ("prompt_tokens", "completion_tokens"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise _bad(f"--{flag.replace('_', '-')} must be >= 1")
    if args.env_timeout_s is not None and args.env_timeout_s < 0:
        raise _bad("--env-timeout-s must be >= 0")
    return Workload(
        params=params, weight_bytes_per_param=2 if cfg.model.engine_dtype == "bfloat16" else 4,
        grad_bytes_per_param=4, prompts_per_step=cfg.rollout.prompts_per_step,
        group_size=cfg.rollout.group_size, prompt_tokens=args.prompt_tokens or 256,
        completion_tokens=args.completion_tokens or cfg.rollout.max_new_tokens,
        env_median_s=median, env_sigma=env_sigma(median, p99),
        env_timeout_s=(args.env_timeout_s if args.env_timeout_s is not None
                       else Limits().wall_s if median else 0.0),
        sandboxes=sandboxes)


def run(args) -> int:
    """`traingym plan`: prints the inputs, one row per configuration and the best runnable."""
    from traingym.config import build_config

    if args.sim_steps < 8:
        raise _bad(f"--sim-steps {args.sim_steps}: need at least 8 (4 are warm-up)")
    cluster = target_cluster(args)
    cfg = build_config(args.preset, args.config, args.overrides)
    figures = codec_figures(args.codec_figures)
    params = model_params(cfg.model.path)
    w = workload(cfg, args, cluster, params)
    r = rates(cluster, params)
    ks = (1, 2) if cfg.mode == "sync" else tuple(sorted({1, 2, cfg.async_.max_staleness}))
    rows = [size_row(name, sim, cluster, why)
            for name, sim, why in candidates(w, cluster, r, figures, args.sim_steps, ks)]
    print(report(cfg, cluster, w, r, figures, rows))
    return 0


def report(cfg, c: TargetCluster, w: Workload, r: Rates, f: CodecFigures,
           rows: list[Row]) -> str:
    """The plan as text: inputs, a table, the best runnable configuration."""
    wire = "bf16" if w.weight_bytes_per_param == 2 else "fp32"
    lines = [
        f"target: {c.gpus} GPUs ({c.node_gpus} per node, {c.gpus_per_engine} per engine), "
        f"{'unlimited' if not w.sandboxes else w.sandboxes} sandbox slots",
        f"model: {cfg.model.path}, {w.params / 1e6:.2f}M params; weights "
        f"{w.params * w.weight_bytes_per_param / 1e6:.1f} MB {wire}, gradients fp32",
        f"step: {w.prompts_per_step} prompts x {w.group_size} samples, {w.prompt_tokens} "
        f"prompt + {w.completion_tokens} completion tokens each",
        f"env step: median {w.env_median_s:g} s, sigma {w.env_sigma:.3g}, cut at "
        f"{w.env_timeout_s:g} s" if w.env_median_s else "env step: none (a reward function)",
        "rates per GPU: " + ", ".join(
            f"{k} {getattr(r, k):.4g} ({r.source[k]})" for k in r.source),
        *(["note: token rates scaled from the 8B reference to a model under 1B parameters "
           "are far too high (fixed overheads dominate): pass measured --decode-tokens-per-s,"
           " --seq-tokens-per-s and --train-tokens-per-s"]
          if w.params < 1e9 and any(r.source[k] != "given" for k in SCALED) else []),
        f"delta codec ({f.source}): {f.bytes_per_changed:.3f} B per changed element at "
        f"{f.changed_fraction:.2%} changed; encode + hash {f.encode_bytes_per_s / GB:.2f} GB/s,"
        f" decode + 2 hashes {f.decode_bytes_per_s / GB:.2f} GB/s, hash "
        f"{f.hash_bytes_per_s / GB:.1f} GB/s (one core)",
        "",
        f"{'configuration':26} {'T+E':>9} {'sandboxes':>11} {'s/step':>8} {'samples/s':>10} "
        f"{'train':>6} {'sync':>5} {'idle':>5} {'engines':>7} {'envs':>5}  runnable",
    ]
    why = list(dict.fromkeys(x.runnable for x in rows if x.runnable))
    for x in rows:
        split = "colocated" if x.config.startswith("sync") else f"{x.trainer_gpus}+{x.engines}"
        pool = f"{x.env_workers_needed}/{x.env_workers}" if x.env_workers else "-"
        step = x.seconds_per_step
        lines.append(
            f"{x.config:26} {split:>9} {pool:>11} {step:8.3g} {x.samples_per_s:10.4g} "
            f"{x.train_s / step:6.0%} {x.publish_blocked_s / step:5.0%} "
            f"{x.trainer_idle_frac:5.0%} {x.engine_util:7.0%} "
            f"{x.env_util if x.env_workers else 0:5.0%}  "
            + ("STALLED " if x.stalled else "") + (f"no [{why.index(x.runnable) + 1}]"
                                                   if x.runnable else "yes"))
    lines += [f"[{i + 1}] {reason}" for i, reason in enumerate(why)]
    lines.append("(T+E: trainer GPUs + engines; sandboxes: needed within 2% / given; train, "
                 "sync, idle: the trainer's step in training, blocked on weight sync, waiting "
                 "for groups; engines, envs: busy fraction)")
    b = best(rows)
    if b is None:
        lines.append("no runnable configuration keeps up (all stalled or not runnable)")
        return "\n".join(lines)
    sync = next(x for x in rows if x.config.startswith("sync"))
    gains = ", ".join(f"{k} {v:+.0%}" for k, v in (b.gains_if_doubled or {}).items())
    lines += ["", f"best runnable: {b.config}: {b.trainer_gpus} trainer GPUs + {b.engines} "
              f"engines, {b.env_workers_needed or 'unlimited'} sandboxes; "
              f"{b.seconds_per_step:.3g} s/step, {b.samples_per_s:.4g} samples/s "
              f"({b.samples_per_s / sync.samples_per_s:.2f}x sync colocated)",
              f"gain if doubled at that split: {gains}"]
    return "\n".join(lines)
