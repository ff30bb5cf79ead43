"""Peak memory of a colocated training run, in bytes per parameter, and the weight sync's share.

Each setting runs in a fresh child process: build the run (default preset: 16 prompts x 4
samples, 8 new tokens, colocated torch engine, weights.transport inproc, codec auto), train
`--steps` steps (default 2; eval before/after off, checkpoints off: the benchmark measures
the sync, not the checkpoint writer; reward `token_parity`, so every group trains, even on a
random-init model), and report the process's peak RSS (ru_maxrss) divided
by the trainer's parameter count (tied embeddings once). Beside the peak, it counts the
tensors and buffers the sync itself holds after the last step, by storage (data_ptr), so a
tensor shared with the engine's model or the trainer's counts as theirs:

- publisher_shadow: the publisher's copy of the last published state (engine dtype);
- subscriber_state: the subscriber's verified state, where it is not the engine's tensors;
- chain: payload buffers the inproc transport keeps for resyncs (the anchor, deltas since);
- fused_extra: the engine's fused decoder's tensors that are not views of its model
  (q|k|v and gate|up concatenations, pre-packed bf16 weights): the engine's, not the sync's,
  but on top of the engine's copy all the same.

Models: 'embedded' (SmolLM2-135M-Instruct) and '362m' (a random-init Llama of SmolLM2-360M's
shape, models/presets.py 'smollm2-360m', with the embedded tokenizer; made once, fp32
safetensors, in --cache, 1.45 GB). The floor a colocated full fine-tune can reach is fp32
weights + gradients + AdamW's two moments (16 B/param) plus the engine's copy (4 B in fp32,
2 B in bf16; model.engine_dtype 'auto' is fp32 on a CPU without bf16 kernels), plus
activations and the allocator's slack.

    PYTHONPATH=src .venv/bin/python benchmarks/sync_memory.py                 # both models
        # -> benchmarks/results/sync_memory/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/sync_memory.py --models embedded --label before
    PYTHONPATH=src .venv/bin/python benchmarks/sync_memory.py --models embedded --label after \
        --merge benchmarks/results/sync_memory/<the before file>.json   # both, side by side

Writes a new result file (benchmarks/resultfile.py; --label is its name's suffix and the
entries' label, default 'current'), one entry per (label, model), each with the commit and the
load average when it ran; --merge FILE first copies the entries of an earlier result file (so
a 'before' and an 'after' run sit side by side; an entry of the same label and model is
replaced in the new file, never in FILE). After each model the entries so far are written to
`<result>.partial` (a later model may fail); the result file itself is written at the end and
the .partial removed. ru_maxrss is a process-wide high-water mark:
it includes the Python interpreter, torch and the tokenizer (about 0.5 GB), and allocator
caching can hide a saving smaller than its granularity.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import resultfile

ROOT = Path(__file__).resolve().parents[1]


def make_362m(folder: Path) -> None:
    """A random-init Llama of SmolLM2-360M's shape with the embedded tokenizer, saved once."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from traingym.models.embedded import embedded_model_dir
    from traingym.models.presets import PRESETS

    a = PRESETS["smollm2-360m"].arch
    src = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(src)
    base = json.loads((src / "config.json").read_text())
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                      tie_word_embeddings=a.tied, rms_norm_eps=base.get("rms_norm_eps", 1e-5),
                      rope_theta=base.get("rope_theta", 100000.0),
                      max_position_embeddings=base.get("max_position_embeddings", 8192),
                      bos_token_id=base.get("bos_token_id"), eos_token_id=base.get("eos_token_id"),
                      pad_token_id=base.get("pad_token_id"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(folder)


def token_parity(sample) -> float:
    """The reward: the fraction of odd token ids in the completion. Random samples differ in
    it, so every group has a non-zero advantage and every step trains (a random-init model
    scores 0 on the arithmetic task, and GRPO would skip its groups)."""
    ids = sample.completion_ids
    return sum(i % 2 for i in ids) / len(ids) if ids else 0.0


def _storages(tensors) -> dict[int, int]:
    """Bytes per storage (tensors sharing one are counted once); a tensor whose storage cannot
    be read (an opaque one, e.g. a oneDNN-packed weight) counts alone, by its elements."""
    out = {}
    for t in tensors:
        try:
            s = t.untyped_storage()
        except NotImplementedError:
            out[id(t)] = t.numel() * t.element_size()
            continue
        out[s.data_ptr()] = s.nbytes()
    return out


def sync_held(run) -> dict:
    """Bytes the sync holds beyond the engine's and the trainer's own tensors."""
    from traingym.weights.colocated import wire_views

    w, engine = run.weights, run.engine
    engine_model = _storages(engine.model.state_dict().values())
    trainer = _storages(run.trainer.export().values())
    theirs = set(engine_model) | set(trainer)

    def extra(tensors) -> int:
        return sum(n for p, n in _storages(tensors).items() if p not in theirs)

    shadow = w.publisher._shadow or {}
    sub = w.subscriber._state or {}
    chain_bytes = 0
    hub = getattr(w.sender, "hub", None)
    if hub is not None:
        seen = {}
        for p in hub.chain._frames + [p for r in hub.receivers for p in r._queue]:
            seen[id(p)] = p.nbytes
        chain_bytes = sum(seen.values())
    fused = getattr(engine, "fused", None)
    fused_extra = 0
    if fused is not None:
        ts = [t for layer in fused.layers for t in layer if hasattr(t, "untyped_storage")]
        ts += [fused.lm_head, fused.embed, fused.norm]
        fused_extra = extra(ts)
    engine_bytes = sum(engine_model.values())
    wire = wire_views(engine.model.state_dict())
    return {"engine_bytes": engine_bytes,
            "engine_wire_bytes": sum(t.numel() * t.element_size() for t in wire.values()),
            "publisher_shadow": extra(shadow.values()),
            "subscriber_state": extra(sub.values()),
            "chain": chain_bytes, "fused_extra": fused_extra}


def child(args) -> dict:
    import resource

    import torch

    import traingym
    from traingym.loop.sync import train_loop
    from traingym.loop.build import build_run

    torch.set_num_threads(args.threads)
    path = "embedded" if args.model == "embedded" else str(Path(args.cache) / "llama-362m")
    cfg = traingym.build_config("default", overrides={
        "steps": args.steps, "model": {"path": path},
        "task": {"reward": "sync_memory:token_parity"},
        "eval": {"before": False, "after": False}})
    run_dir = Path(args.run_dir)
    t0 = time.perf_counter()
    run, start = build_run(cfg, run_dir, False, progress=False)
    run.maybe_checkpoint = lambda *a, **k: False  # measure the sync, not the checkpoint writer
    built_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    held_built = sync_held(run)
    train_loop(run, start)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    held = sync_held(run)
    params = sum(p.numel() for p in run.trainer.model.parameters())
    adam_tensors = sum(len(v) for v in run.trainer.optimizer.state.values())
    engine_dtype = str(next(run.engine.model.parameters()).dtype).removeprefix("torch.")
    run.close()
    eng = held["engine_wire_bytes"]
    sync_bytes = held["publisher_shadow"] + held["subscriber_state"] + held["chain"]
    return {"params": params, "engine_dtype": engine_dtype, "steps": args.steps,
            "optimizer_state_tensors": adam_tensors, "in_place": getattr(run.weights,
                                                                         "in_place", False),
            "seconds": round(time.perf_counter() - t0, 1),
            "peak_rss_mib": round(peak_mib, 1), "built_rss_mib": round(built_mib, 1),
            "peak_bytes_per_param": round(peak_mib * 2**20 / params, 2),
            "built_bytes_per_param": round(built_mib * 2**20 / params, 2),
            "sync_held_after_build": held_built, "sync_held": held,
            "sync_extra_copies": round(sync_bytes / eng, 3),
            "sync_bytes_per_param": round(sync_bytes / params, 2),
            "fused_extra_bytes_per_param": round(held["fused_extra"] / params, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="embedded,362m")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default="/tmp/traingym_sync_memory")
    ap.add_argument("--merge", default=None, metavar="FILE",
                    help="an earlier result file whose entries the new file starts from")
    resultfile.add_args(ap)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.model = args.child
        print(json.dumps(child(args)))
        return
    rec = resultfile.start("sync_memory", args)
    label = args.label or "current"
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    results: dict = {"runs": {}}
    if args.merge:
        results["runs"] = dict(json.loads(Path(args.merge).read_text())["runs"])
        results["merged_from"] = str(args.merge)
    partial = Path(f"{args.out or resultfile.new_path('sync_memory', args.label, rec.started)}"
                   ".partial")
    commit = resultfile.git("rev-parse", "--short", "HEAD")
    for model in args.models.split(","):
        if model == "362m" and not (cache / "llama-362m").exists():
            subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); "
                            "import sync_memory as s; from pathlib import Path; "
                            "s.make_362m(Path(%r))" % (str(ROOT / "benchmarks"),
                                                       str(cache / "llama-362m"))], check=True)
        run_dir = cache / f"run-{model}-{os.getpid()}"
        proc = subprocess.run([sys.executable, __file__, "--child", model, "--steps",
                               str(args.steps), "--threads", str(args.threads),
                               "--run-dir", str(run_dir)],
                              capture_output=True, text=True, env={**os.environ,
                                                                   "OMP_NUM_THREADS": str(args.threads)})
        if proc.returncode != 0:
            sys.exit(f"{model}: child failed (exit {proc.returncode}; -9: killed, e.g. out of "
                     f"memory):\n{proc.stderr[-4000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r.update(commit=commit, loadavg=os.getloadavg()[0], label=label)
        results["runs"][f"{label}/{model}"] = r
        print(f"{label:>8} {model:>9}: peak {r['peak_rss_mib']:.0f} MiB = "
              f"{r['peak_bytes_per_param']:.1f} B/param ({r['params'] / 1e6:.1f}M params, engine "
              f"{r['engine_dtype']}); sync holds {r['sync_extra_copies']:.2f} engine copies "
              f"({r['sync_bytes_per_param']:.2f} B/param), fused decoder "
              f"{r['fused_extra_bytes_per_param']:.2f} B/param", flush=True)
        import shutil
        shutil.rmtree(run_dir, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)  # after each model: a later one may fail
        partial.write_text(json.dumps(results, indent=1) + "\n")
    rec.write(results)
    partial.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
