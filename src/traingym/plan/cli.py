"""`traingym plan`: what a run's config would do on a target GPU cluster, predicted by the
pipeline simulator (plan/simulate.py) before any cluster time is spent.

The config gives the model's size (counted on torch's meta device, no weights loaded), wire
dtype, step shape and rollout.max_new_tokens (taken as every completion's length: an upper
bound); flags give what a config cannot know (the target cluster, prompt length, env latency);
the delta codec's figures are the ones shipped in the package (plan/figures/codec.json, written by
benchmarks/plan_figures.py) unless --codec-figures names another file (`codec_figures`).
Candidates, GPU presets and limits: plan/planner.py. Imports are late because
`traingym --help` imports this module.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from pathlib import Path

from traingym.models.embedded import EMBEDDED_NAME, cache_dir, gguf_path
from traingym.models.presets import get as get_preset
from traingym.plan.planner import (
    CODEC_FIGURES,
    GB,
    GPU_PRESETS,
    SCALED,
    CodecFigures,
    Rates,
    Row,
    TargetCluster,
    Workload,
    bad,
    best,
    candidates,
    check_cluster,
    codec_figures,
    rates,
    size_row,
)

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
    p.add_argument("--codec-figures", metavar="JSON", help="the delta codec's measured "
                   "figures: a file of benchmarks/plan_figures.py or a result file of "
                   "benchmarks/weight_sync.py --sections compress,throughput (default: "
                   f"traingym's own, traingym/plan/{CODEC_FIGURES})")
    p.add_argument("--sim-steps", type=int, default=20, help="simulated steps (4 warm-up)")


def target_cluster(args) -> TargetCluster:
    """The cluster from --cluster's file, then the flags."""
    import tomllib

    from traingym.core.errors import did_you_mean  # heavy: pydantic

    c = TargetCluster()
    names = [f.name for f in fields(TargetCluster)]
    if args.cluster:
        path = Path(args.cluster)
        if not path.is_file():
            raise bad(f"--cluster {path}: no such file")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise bad(f"--cluster {path}: not TOML: {e}") from None
        for key, value in data.items():
            if key not in names:
                raise bad(f"--cluster {path}: unknown key {key!r}"
                          + (did_you_mean(key, names) or f"; keys: {names}"))
            want = type(getattr(c, key))
            if not isinstance(value, (int, float, str)) or isinstance(value, bool) or (
                    want is str) != isinstance(value, str) or (
                    want is int and not isinstance(value, int)):
                raise bad(f"--cluster {path}: {key} = {value!r}: expected {want.__name__}")
            c = replace(c, **{key: want(value)})
    given = {n: getattr(args, f"cluster_{n}") for n in names}
    return check_cluster(replace(c, **{n: v for n, v in given.items() if v is not None}))


def model_params(path: str) -> tuple[int, int]:
    """(all, active) parameters of model.path (tied weights once; active: those one token
    runs, k of a mixture of experts' E experts a layer), from its config only."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if path == "tiny":
        from traingym.models.loader import tiny_model, tiny_tokenizer  # heavy: torch

        model = tiny_model(tiny_tokenizer())
    else:
        if path == "embedded":
            folder = cache_dir() / "models" / EMBEDDED_NAME
            if (folder / "config.json").is_file():
                config = AutoConfig.from_pretrained(folder)
            else:  # the GGUF file's metadata: no dequantisation
                src = gguf_path()
                config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
        else:
            folder = Path(path).expanduser()
            if not (folder / "config.json").is_file():
                raise bad(f"model.path={path!r}: not a Hugging Face model folder (no "
                          "config.json); use 'embedded', 'tiny', or a local folder")
            config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    from traingym.models.moe import active_params  # heavy: torch, numpy

    return sum(p.numel() for p in model.parameters()), active_params(model)


def env_sigma(median_s: float, p99_s: float) -> float:
    """Lognormal sigma with the given median and 99th percentile."""
    return math.log(p99_s / median_s) / 2.3263478740408408 if median_s and p99_s else 0.0


def workload(cfg, args, cluster: TargetCluster, params: int) -> Workload:
    """The run's step from its config and the flags; fails when the config runs an env and
    no latency is given."""
    from traingym.sandbox.base import Limits  # heavy: pydantic

    runs_env = cfg.task.env is not None
    if runs_env and args.env_median_s is None:
        raise bad(f"the config's task.env ({cfg.task.env}) runs an environment whose latency "
                  "a config cannot know: pass --env-median-s (and --env-p99-s)")
    median = args.env_median_s or 0.0
    p99 = args.env_p99_s if args.env_p99_s is not None else median
    if median < 0 or p99 < median:
        raise bad(f"--env-median-s {median} / --env-p99-s {p99}: need 0 <= median <= p99")
    if median == 0 and p99 > 0:
        raise bad("--env-p99-s needs --env-median-s > 0")
    sandboxes = cluster.sandboxes
    if sandboxes == -1:
        sandboxes = cfg.cluster.sandbox_workers or (8 * cluster.gpus if runs_env else 0)
    for flag in ("prompt_tokens", "completion_tokens"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise bad(f"--{flag.replace('_', '-')} must be >= 1")
    if args.env_timeout_s is not None and args.env_timeout_s < 0:
        raise bad("--env-timeout-s must be >= 0")
    return Workload(
        params=params,  # 'auto' engine dtype: bf16 (the planned GPUs have bf16 kernels)
        weight_bytes_per_param=4 if cfg.model.engine_dtype == "float32" else 2,
        grad_bytes_per_param=4, prompts_per_step=cfg.rollout.prompts_per_step,
        group_size=cfg.rollout.group_size, prompt_tokens=args.prompt_tokens or 256,
        completion_tokens=args.completion_tokens or cfg.rollout.max_new_tokens,
        env_median_s=median, env_sigma=env_sigma(median, p99),
        env_timeout_s=(args.env_timeout_s if args.env_timeout_s is not None
                       else Limits().wall_s if median else 0.0),
        sandboxes=sandboxes)


def run(args) -> int:
    """`traingym plan`: prints the inputs, one row per configuration and the best runnable."""
    from traingym.config.load import build_config  # heavy: pydantic, safetensors, torch

    if args.sim_steps < 8:
        raise bad(f"--sim-steps {args.sim_steps}: need at least 8 (4 are warm-up)")
    cluster = target_cluster(args)
    cfg = build_config(args.preset, args.config, args.overrides)
    figures = codec_figures(args.codec_figures)
    if cfg.model.preset:  # no weights needed
        preset = get_preset(cfg.model.preset)
        params, active = preset.params, preset.active_params
    else:
        params, active = model_params(cfg.model.path)
    w = replace(workload(cfg, args, cluster, params), active_params=active)
    r = rates(cluster, active)  # compute per token: the experts a token runs
    ks = (1, 2) if cfg.mode == "sync" else tuple(sorted({1, 2, cfg.async_.max_staleness}))
    rows = [size_row(name, sim, cluster, why)
            for name, sim, why in candidates(w, cluster, r, figures, args.sim_steps, ks)]
    print(report(cfg, cluster, w, r, figures, rows))
    return 0


def report(cfg, c: TargetCluster, w: Workload, r: Rates, f: CodecFigures,
           rows: list[Row]) -> str:
    """The plan as text: inputs, a table, the best runnable configuration."""
    wire = "bf16" if w.weight_bytes_per_param == 2 else "fp32"
    active = w.active_params or w.params
    lines = [
        f"target: {c.gpus} GPUs ({c.node_gpus} per node, {c.gpus_per_engine} per engine), "
        f"{'unlimited' if not w.sandboxes else w.sandboxes} sandbox slots",
        f"model: {cfg.model.path}, {w.params / 1e6:.2f}M params"
        + (f" ({active / 1e6:.2f}M active a token: token rates scale with those, weights "
           "and memory with all)" if active != w.params else "") + "; weights "
        f"{w.params * w.weight_bytes_per_param / 1e6:.1f} MB {wire}, gradients fp32",
        *([_preset_memory(cfg.model.preset, wire)] if cfg.model.preset else []),
        f"step: {w.prompts_per_step} prompts x {w.group_size} samples, {w.prompt_tokens} "
        f"prompt + {w.completion_tokens} completion tokens each",
        f"env step: median {w.env_median_s:g} s, sigma {w.env_sigma:.3g}, cut at "
        f"{w.env_timeout_s:g} s" if w.env_median_s else "env step: none (a reward function)",
        "rates per GPU: " + ", ".join(
            f"{k} {getattr(r, k):.4g} ({r.source[k]})" for k in r.source),
        *(["note: token rates scaled from the 8B reference to a model under 1B parameters "
           "are far too high (fixed overheads dominate): pass measured --decode-tokens-per-s,"
           " --seq-tokens-per-s and --train-tokens-per-s"]
          if active < 1e9 and any(r.source[k] != "given" for k in SCALED) else []),
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


def _preset_memory(name: str, wire: str) -> str:
    """models/presets.py's memory figures (every expert of a mixture of experts)."""
    m = get_preset(name).memory("bfloat16" if wire == "bf16" else "float32")
    return (f"memory (model.preset {name}): trainer {m['trainer'] / GB:.1f} GB (fp32 weights, "
            f"grads, AdamW moments), engine copy {m['engine'] / GB:.1f} GB, total "
            f"{m['total'] / GB:.1f} GB, before activations and KV cache")
