"""Where the peak memory of a colocated full fine-tune goes: the peak by phase and the resident
tensors by owner, in bytes per parameter.

Each setting runs in a fresh child process (the run of sync_memory.py: default preset, 16
prompts x 4 samples, 8 new tokens, colocated torch engine, reward `token_parity` so every group
trains, eval and checkpoints off). Phases are the run's own trace spans (core/trace.py: collect,
generate, forward, backward, optimizer, publish, ...): the child wraps `trace.span` so that on
entering and leaving each span it reads the kernel's high-water mark (VmHWM, /proc/self/status)
and resets it (writing 5 to /proc/self/clear_refs). A phase's peak is the highest RSS while it
was the innermost span: exact, not sampled. `outside` is the time outside every span
(building the run, between steps).

After the last step it sums the tensors each owner holds, by storage (shared storage counted
once, for the first owner in this order): trainer weights, gradients, optimizer state, engine
model, the fused decoder's own tensors (concatenations, pre-packed weights), the sync's
(publisher shadow, subscriber copy). The rest of the peak is the interpreter and libraries
(the `interpreter` entry: RSS after importing torch and transformers, before the run) and
transients: activations, logits, allocator slack.

    PYTHONPATH=src .venv/bin/python benchmarks/memory_phases.py --models 362m
        # -> benchmarks/results/memory_phases/<date>-<commit>[-label].json
    ... --set trainer.micro_batch_groups=1 --label mb1   # any config override, dotted

The 362M model is sync_memory.py's (a random-init Llama of SmolLM2-360M's shape, made once in
--cache); 'embedded' is the embedded SmolLM2-135M-Instruct; a folder path is any HF model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import resultfile

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def hwm_mib() -> float:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def rss_mib() -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def rss_parts_mib() -> dict[str, float]:
    """The resident set by kind: anonymous (heap, tensors), file-backed (mapped files: libraries,
    a model file still mapped), shared memory."""
    text = Path("/proc/self/status").read_text()
    return {k: round(int(re.search(rf"{k}:\s+(\d+)", text).group(1)) / 1024, 1)
            for k in ("RssAnon", "RssFile", "RssShmem")}


def reset_hwm() -> None:
    Path("/proc/self/clear_refs").write_text("5")


class PhasePeaks:
    """Peak RSS (MiB) per innermost trace span, by resetting the high-water mark at each edge."""

    def __init__(self) -> None:
        self.stack = ["outside"]
        self.peak: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def edge(self) -> None:
        name = self.stack[-1]
        self.peak[name] = max(self.peak.get(name, 0.0), hwm_mib())
        reset_hwm()

    def install(self) -> None:
        from traingym.core import trace

        real = trace.span
        peaks = self

        class Phase:
            def __init__(self, name, inner):
                self.name, self.inner = name, inner

            def __enter__(self):
                peaks.edge()
                peaks.stack.append(self.name)
                peaks.count[self.name] = peaks.count.get(self.name, 0) + 1
                return self.inner.__enter__()

            def __exit__(self, *exc):
                out = self.inner.__exit__(*exc)
                peaks.edge()
                peaks.stack.pop()
                return out

        trace.span = lambda name, cat="run", **args: Phase(name, real(name, cat, **args))


def _storage_bytes(t) -> tuple[int, int]:
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (NotImplementedError, RuntimeError):  # opaque (a oneDNN-packed weight): by elements
        return id(t), t.numel() * t.element_size()


def owners(run) -> dict[str, int]:
    """Bytes each owner holds, by storage; a storage counts for the first owner listed."""
    import torch

    trainer = run.trainer
    engine = run.engine
    groups: dict[str, list] = {
        "trainer_weights": [p for p in trainer.model.parameters()],
        "gradients": [p.grad for p in trainer.model.parameters() if p.grad is not None],
        "optimizer_state": [v for st in trainer.optimizer.state.values() for v in st.values()
                            if isinstance(v, torch.Tensor)],
        "engine_model": list(engine.model.state_dict().values()),
    }
    fused = getattr(engine, "fused", None)
    if fused is not None:
        groups["fused_decoder"] = [t for layer in fused.layers for t in layer
                                   if isinstance(t, torch.Tensor)] + [fused.lm_head, fused.embed,
                                                                        fused.norm]
    w = run.weights
    groups["sync_shadow"] = list((getattr(getattr(w, "publisher", None), "_shadow", None)
                                  or {}).values())
    groups["sync_subscriber"] = list((getattr(getattr(w, "subscriber", None), "_state", None)
                                      or {}).values())
    seen: set[int] = set()
    out = {}
    for name, tensors in groups.items():
        total = 0
        for t in tensors:
            key, n = _storage_bytes(t)
            if key not in seen:
                seen.add(key)
                total += n
        out[name] = total
    return out


def run_overrides(steps: int, path: str, sets: list[str]) -> dict:
    """The measured run's config: `steps` steps of `path`, every group trained, no evaluations,
    then each KEY=VALUE of `sets` (dotted key, JSON value or a plain string)."""
    overrides: dict = {"steps": steps, "model": {"path": path},
                       "task": {"reward": "sync_memory:token_parity"},
                       "eval": {"before": False, "after": False}}
    for item in sets:
        key, _, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = overrides
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return overrides


def child(args) -> dict:
    import torch
    import transformers  # noqa: F401  (counted in the interpreter's share)

    import traingym
    from traingym.loop.build import build_run
    from traingym.loop.sync import train_loop

    torch.set_num_threads(args.threads)
    interpreter = rss_mib()
    peaks = PhasePeaks()
    peaks.install()
    reset_hwm()
    path = args.model if args.model not in ("362m",) else str(Path(args.cache) / "llama-362m")
    overrides = run_overrides(args.steps, path, args.set)
    cfg = traingym.build_config("default", overrides=overrides)
    t0 = time.perf_counter()
    run, start = build_run(cfg, Path(args.run_dir), False, progress=False)
    run.maybe_checkpoint = lambda *a, **k: False
    peaks.edge()
    built = rss_mib()
    built_parts = rss_parts_mib()
    step_s = []
    real_step = run.trainer.train_step

    def timed(batch):
        t = time.perf_counter()
        out = real_step(batch)
        step_s.append(time.perf_counter() - t)
        return out

    run.trainer.train_step = timed
    train_loop(run, start)
    peaks.edge()
    held = owners(run)
    params = sum(p.numel() for p in run.trainer.model.parameters())
    engine_dtype = str(next(run.engine.model.parameters()).dtype).removeprefix("torch.")
    seconds = time.perf_counter() - t0
    end_rss = rss_mib()
    end_parts = rss_parts_mib()
    run.close()
    peak = max(peaks.peak.values())

    def per_param(mib):
        return round(mib * MIB / params, 2)

    return {"params": params, "engine_dtype": engine_dtype, "steps": args.steps,
            "overrides": args.set, "seconds": round(seconds, 1),
            "train_step_s": [round(s, 2) for s in step_s],
            "interpreter_mib": round(interpreter, 1), "built_rss_mib": round(built, 1),
            "end_rss_mib": round(end_rss, 1), "peak_rss_mib": round(peak, 1),
            "built_rss_parts_mib": built_parts, "end_rss_parts_mib": end_parts,
            "peak_bytes_per_param": per_param(peak),
            "phase_peak_mib": {k: round(v, 1) for k, v in sorted(peaks.peak.items(),
                                                                 key=lambda kv: -kv[1])},
            "phase_peak_bytes_per_param": {k: per_param(v) for k, v in peaks.peak.items()},
            "phase_count": peaks.count,
            "held_bytes_per_param": {k: round(v / params, 2) for k, v in held.items()},
            "held_mib": {k: round(v / MIB, 1) for k, v in held.items()},
            "interpreter_bytes_per_param": per_param(interpreter),
            "transient_bytes_per_param": per_param(peak - interpreter - sum(held.values()) / MIB)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="362m", help="comma-separated: 362m, embedded, a folder")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default="/tmp/traingym_sync_memory")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override (dotted key, JSON value), repeatable")
    resultfile.add_args(ap)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.model = args.child
        print(json.dumps(child(args)))
        return
    rec = resultfile.start("memory_phases", args)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    results: dict = {"runs": {}}
    for model in args.models.split(","):
        if model == "362m" and not (cache / "llama-362m").exists():
            sys.path.insert(0, str(ROOT / "benchmarks"))
            import sync_memory

            sync_memory.make_362m(cache / "llama-362m")
        run_dir = cache / f"phases-{os.getpid()}"
        cmd = [sys.executable, __file__, "--child", model, "--steps", str(args.steps),
               "--threads", str(args.threads), "--cache", str(cache), "--run-dir", str(run_dir)]
        for s in args.set:
            cmd += ["--set", s]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks"),
                                              os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)
        if proc.returncode != 0:
            sys.exit(f"{model}: child failed (exit {proc.returncode}; -9: killed, e.g. out of "
                     f"memory):\n{proc.stderr[-4000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results["runs"][model] = r
        print(f"{model}: peak {r['peak_rss_mib']:.0f} MiB = {r['peak_bytes_per_param']} B/param; "
              f"held {r['held_bytes_per_param']}; interpreter "
              f"{r['interpreter_bytes_per_param']}; transient {r['transient_bytes_per_param']}",
              flush=True)
        print("  phases (B/param):", {k: r["phase_peak_bytes_per_param"][k]
                                      for k in r["phase_peak_mib"]}, flush=True)
    rec.write(results)


if __name__ == "__main__":
    main()
