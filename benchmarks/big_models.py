"""Billion-parameter models on this CPU: peak memory and seconds per step of a 1.2B full
fine-tune and a 1.7B LoRA run, 3 steps each.

Settings (each in a fresh child process, the run of memory_phases.py: default preset, 16
prompts x 4 samples, 8 new tokens, colocated torch engine in model.engine_dtype 'auto', reward
`token_parity` so every group trains, eval and checkpoints off):

- `llama-1.2b`: Llama-3.2-1B's shape (models/presets.py 'llama3.2-1b', RoPE as its
  config.json: theta 5e5, llama3 scaling x32), random init, fp32 safetensors (4.9 GB); full
  fine-tune with the memory-saving options of trainer/optimizers.py (SETTINGS below: 8-bit
  AdamW moments, the step inside the backward pass, so no clipping). Target: peak <= 20 GB.
- `qwen3-1.7b-lora`: Qwen3-1.7B's shape ('qwen3-1.7b'), random init, bf16 safetensors (3.4 GB);
  LoRA rank 16 on q/k/v/o with `lora.base_dtype = bfloat16` and `lora.sync = adapter`, so the
  engine's frozen tensors are the trainer's (trainer/lora.py share_frozen). Target: 12 GB.

Both models carry the embedded tokenizer (49,152 ids; a sampled id beyond it decodes to
nothing, which `token_parity` does not read). Made once in --cache, each in its own process.

Peak RSS is the kernel's high-water mark (VmHWM), also split by trace phase (memory_phases.py
PhasePeaks: exact, reset at each span edge; each `optimizer.step` call is a phase of its own,
`optimizer_step`, also where it runs inside the backward pass) and, after the last step, the
tensors each owner holds (memory_phases.py `owners`). Seconds: each train_step (forward,
backward, optimizer; median of the steps) and each loop step (rollout + train + sync, from
events.jsonl), and the whole child (load, build, steps). Memory does not depend on the
machine's load; seconds do (the load average is in the result's provenance).

    PYTHONPATH=src .venv/bin/python benchmarks/big_models.py --settings llama-1.2b
    PYTHONPATH=src .venv/bin/python benchmarks/big_models.py --settings qwen3-1.7b-lora
        # -> benchmarks/results/big_models/<date>-<commit>[-label].json
    ... --set trainer.micro_batch_groups=1 --label mb1   # any config override, dotted, JSON

`--set` applies to every setting of the invocation, after the setting's own overrides.
`--what-if-trim` returns the allocator's free pages (core/memory.py trim) before each
`optimizer.step` call: a what-if, not what the library does; inside the backward pass
(trainer.optimizer_in_backward) the heap then holds the pass's freed activations when a large
tensor's 8-bit step allocates its temporaries. Its runs are named `<setting>/what-if-trim`.
Not covered: pretrained weights (random init: speed and memory only, no learning curve), the
other engines (vLLM, where a preset of 1B and more would put rollouts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import resultfile

ROOT = Path(__file__).resolve().parents[1]
GB = 10**9


@dataclass(frozen=True)
class Setting:
    preset: str  # models/presets.py
    disk_dtype: str  # the safetensors written once to the cache
    hf_extra: dict  # config.json fields beyond the preset's architecture
    overrides: dict  # the run's config, beside the common ones
    target_gb: float
    notes: str = ""


SETTINGS = {
    # Llama-3.2-1B config.json (meta-llama/Llama-3.2-1B): rope_theta 500000, rope_scaling
    # llama3 (factor 32, low 1, high 4, original 8192), max_position_embeddings 131072,
    # rms_norm_eps 1e-5
    "llama-1.2b": Setting(
        "llama3.2-1b", "float32",
        {"rope_theta": 500000.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
         "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
        {"trainer": {"optimizer": "adamw_8bit", "optimizer_in_backward": True,
                     "grad_clip": 0.0}},
        20.0, "full fine-tune; 8-bit AdamW moments, stepped inside the backward pass"),
    # Qwen3-1.7B config.json (Qwen/Qwen3-1.7B): rope_theta 1e6, max_position_embeddings 40960,
    # rms_norm_eps 1e-6
    "qwen3-1.7b-lora": Setting(
        "qwen3-1.7b", "bfloat16",
        {"rope_theta": 1000000.0, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6},
        {"lora": {"rank": 16, "base_dtype": "bfloat16", "sync": "adapter"}},
        12.0, "LoRA rank 16 (q/k/v/o), frozen base in bf16, shared with the engine"),
}


def model_dir(args, name: str) -> Path:
    return Path(args.cache) / (name if args.layers is None else f"{name}-L{args.layers}")


def make_model(name: str, folder: Path, layers: int | None = None) -> None:
    """A random-init model of the setting's shape (`layers`: fewer, for a smoke run) with the
    embedded tokenizer, saved once."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from traingym.models.embedded import embedded_model_dir
    from traingym.models.presets import PRESETS

    s = SETTINGS[name]
    a = PRESETS[s.preset].arch
    a = a if layers is None else replace(a, layers=layers)
    src = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(src)
    base = json.loads((src / "config.json").read_text())
    cfg = AutoConfig.for_model(
        a.model_type, vocab_size=a.vocab, hidden_size=a.hidden,
        intermediate_size=a.intermediate, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        tie_word_embeddings=a.tied, bos_token_id=base.get("bos_token_id"),
        eos_token_id=base.get("eos_token_id"), pad_token_id=base.get("pad_token_id"),
        **s.hf_extra)
    dtype = getattr(torch, s.disk_dtype)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    if params != a.params():
        raise SystemExit(f"{name}: built {params} parameters, the preset counts {a.params()}")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(folder)


def _overrides(setting: Setting, args) -> dict:
    from memory_phases import run_overrides

    items = [f"{k}.{k2}={json.dumps(v)}" for k, sec in setting.overrides.items()
             for k2, v in sec.items()] + list(args.set)
    return run_overrides(args.steps, str(model_dir(args, args.name)), items)


def child(args) -> dict:
    import torch
    import transformers  # noqa: F401  (counted in the interpreter's share)
    from memory_phases import PhasePeaks, owners, reset_hwm, rss_mib

    import traingym
    from traingym.core import memory, trace
    from traingym.loop.build import build_run
    from traingym.loop.sync import train_loop
    from traingym.observability.events import read_events

    torch.set_num_threads(args.threads)
    interpreter = rss_mib()
    peaks = PhasePeaks()
    peaks.install()
    reset_hwm()
    setting = SETTINGS[args.name]
    overrides = _overrides(setting, args)
    cfg = traingym.build_config("default", overrides=overrides)
    t0 = time.perf_counter()
    run, start = build_run(cfg, Path(args.run_dir), False, progress=False)
    run.maybe_checkpoint = lambda *a, **k: False
    peaks.edge()
    built = rss_mib()
    build_s = time.perf_counter() - t0
    step_s = []
    real_step = run.trainer.train_step

    def timed(batch):
        t = time.perf_counter()
        out = real_step(batch)
        step_s.append(time.perf_counter() - t)
        return out

    run.trainer.train_step = timed
    optimizer = run.trainer.optimizer
    real_opt_step = optimizer.step

    def opt_step(*a, **k):  # its own phase, also where it runs inside the backward pass
        if args.what_if_trim:
            memory.trim()
        with trace.span("optimizer_step", cat="trainer"):
            return real_opt_step(*a, **k)

    optimizer.step = opt_step
    train_loop(run, start)
    peaks.edge()
    held = owners(run)
    model = run.trainer.model
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    engine_dtype = str(next(run.engine.model.parameters()).dtype).removeprefix("torch.")
    events = read_events(Path(args.run_dir))
    seconds = time.perf_counter() - t0
    run.close()
    peak = max(peaks.peak.values())
    mib = 2**20
    t = cfg.trainer
    return {
        "params": params, "layers": model.config.num_hidden_layers,
        "trainable_params": trainable, "trainer_param_dtypes": dtypes,
        "engine_dtype": engine_dtype, "steps": args.steps, "overrides": overrides,
        "settings": {"prompts_per_step": cfg.rollout.prompts_per_step,
                     "group_size": cfg.rollout.group_size,
                     "max_new_tokens": cfg.rollout.max_new_tokens,
                     "micro_batch_groups": t.micro_batch_groups,
                     "micro_batch_tokens": t.micro_batch_tokens,
                     "optimizer": getattr(t, "optimizer", "adamw"),
                     "optimizer_in_backward": getattr(t, "optimizer_in_backward", False),
                     "grad_clip": t.grad_clip, "bf16_autocast": t.bf16_autocast,
                     "gradient_checkpointing": t.gradient_checkpointing,
                     "lora_rank": cfg.lora.rank, "lora_base_dtype": cfg.lora.base_dtype,
                     "lora_sync": cfg.lora.sync, "threads": args.threads,
                     "what_if_trim": args.what_if_trim},
        "peak_rss_gb": round(peak * mib / GB, 2), "peak_rss_mib": round(peak, 1),
        "peak_bytes_per_param": round(peak * mib / params, 2),
        "target_gb": setting.target_gb, "within_target": peak * mib / GB <= setting.target_gb,
        "train_step_s": [round(s, 1) for s in step_s],
        "train_step_median_s": round(statistics.median(step_s), 1),
        "loop_step_s": [round(e["seconds_step"], 1) for e in events],
        "loop_step_median_s": round(statistics.median(e["seconds_step"] for e in events), 1),
        "rollout_s": [round(e["seconds_rollout"], 1) for e in events],
        "sync_s": [round(e["seconds_sync"], 1) for e in events],
        "groups_kept": [e.get("groups_kept") for e in events],
        "build_s": round(build_s, 1), "total_s": round(seconds, 1),
        "interpreter_mib": round(interpreter, 1), "built_rss_mib": round(built, 1),
        "phase_peak_gb": {k: round(v * mib / GB, 2)
                          for k, v in sorted(peaks.peak.items(), key=lambda kv: -kv[1])},
        "phase_count": peaks.count,
        "held_gb": {k: round(v / GB, 2) for k, v in held.items()},
        "held_bytes_per_param": {k: round(v / params, 2) for k, v in held.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default="/tmp/traingym_big")
    ap.add_argument("--layers", type=int, default=None,
                    help="fewer decoder layers than the preset's (smoke runs only: the figures "
                    "are then not the setting's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override (dotted key, JSON value), repeatable")
    ap.add_argument("--what-if-trim", action="store_true",
                    help="return free heap pages before each optimizer.step (a what-if)")
    resultfile.add_args(ap)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--make", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make:
        make_model(args.make, model_dir(args, args.make), args.layers)
        return
    if args.child:
        args.name = args.child
        print(json.dumps(child(args)))
        return
    names = args.settings.split(",")
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        sys.exit(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    rec = resultfile.start("big_models", args)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks"),
                                          os.environ.get("PYTHONPATH", "")])}
    results: dict = {"runs": {}}
    for name in names:
        folder = model_dir(args, name)
        if not folder.exists():
            print(f"{name}: making the random-init model in {folder} ...", flush=True)
            subprocess.run([sys.executable, __file__, "--make", name, "--cache", str(cache)]
                           + (["--layers", str(args.layers)] if args.layers else []),
                           check=True, env=env)
        run_dir = cache / f"run-{name}-{os.getpid()}"
        cmd = [sys.executable, __file__, "--child", name, "--steps", str(args.steps),
               "--threads", str(args.threads), "--cache", str(cache), "--run-dir", str(run_dir)]
        cmd += ["--layers", str(args.layers)] if args.layers else []
        cmd += ["--what-if-trim"] if args.what_if_trim else []
        for s in args.set:
            cmd += ["--set", s]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        shutil.rmtree(run_dir, ignore_errors=True)
        if proc.returncode != 0:
            sys.exit(f"{name}: child failed (exit {proc.returncode}; -9: killed, e.g. out of "
                     f"memory):\n{proc.stderr[-4000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["notes"] = SETTINGS[name].notes
        name += "/what-if-trim" if args.what_if_trim else ""
        results["runs"][name] = r
        print(f"{name}: {r['params'] / 1e9:.2f}B params, peak {r['peak_rss_gb']} GB "
              f"({r['peak_bytes_per_param']} B/param; target {r['target_gb']} GB: "
              f"{'met' if r['within_target'] else 'MISSED'}); train step "
              f"{r['train_step_median_s']} s, loop step {r['loop_step_median_s']} s (median), "
              f"total {r['total_s']} s", flush=True)
        print("  phases (GB):", r["phase_peak_gb"], "\n  held (GB):", r["held_gb"], flush=True)
    rec.write(results)


if __name__ == "__main__":
    main()
