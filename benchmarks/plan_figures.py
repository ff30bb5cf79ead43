"""The delta codec's figures that `traingym plan` ships: measure them with the current codec and
write the package data file src/traingym/plan/figures/codec.json (read by
plan/planner.py `codec_figures`; `traingym plan --codec-figures FILE` overrides it).

    PYTHONPATH=src .venv/bin/python benchmarks/plan_figures.py          # about 2-4 minutes
    PYTHONPATH=src .venv/bin/python benchmarks/plan_figures.py --steps 20 --repeat 20

The measurement is benchmarks/weight_sync.py's, run as it is in a subprocess:
`--sections compress,throughput` on SmolLM2-135M (the embedded model, fp32 masters, its bf16
state of 134.5M elements, 269 MB) after --steps AdamW steps at lr 1e-6 on a policy-gradient
surrogate; the step whose changed fraction is closest to 1% is timed (one thread, best of
--repeat runs, wall clock). From its result the figures are taken exactly as
`codec_figures` takes them from a weight_sync.py result (planner.weight_sync_figures): changed
fraction and wire-frame bytes per changed element at the timed step; encode + target hash,
decode + base re-hash + result hash, and the state hash, in bytes of model state per second.
The file also keeps what was measured (sizes of every step, both clocks, load average) and its
provenance (benchmarks/resultfile.py: command, commit, whether the tree or the codec's code
differed from it, date, machine, versions); --keep saves weight_sync.py's own result too.
Rates are one machine's and move with its load: the file says which machine and when.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import resultfile

from traingym.plan.planner import weight_sync_figures

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src/traingym/plan/figures/codec.json"
CODEC_CODE = ("src/traingym/weights",)  # what the figures measure


def measure(args, result: Path) -> list[str]:
    """Run weight_sync.py's compress and throughput sections into `result`; its command."""
    cmd = [sys.executable, str(ROOT / "benchmarks/weight_sync.py"), "--sections",
           "compress,throughput", "--steps", str(args.steps), "--lr", str(args.lr),
           "--repeat", str(args.repeat)]
    if args.timed_step:
        cmd += ["--timed-step", str(args.timed_step)]
    if args.cache:
        cmd += ["--cache", args.cache]
    cmd += ["--out", str(result)]  # last: the file records the command without it
    src = str(ROOT / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    subprocess.run(cmd, check=True, env=env)
    return cmd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3, help="AdamW steps (step 3 of the seeded "
                   "stream is the one near 1%% changed)")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--repeat", type=int, default=10, help="timed runs per rate, interleaved "
                   "(the best kept: the quietest moment of a shared machine)")
    p.add_argument("--timed-step", type=int, default=0,
                   help="the step to time (default: the one closest to 1%% changed)")
    p.add_argument("--cache", help="weight_sync.py --cache: folder of the bf16 states")
    p.add_argument("--keep", metavar="JSON", help="also keep weight_sync.py's result here")
    p.add_argument("--out", default=str(OUT), help="the figures file (default: the package's)")
    args = p.parse_args()
    from traingym.models.embedded import embedded_model_dir

    embedded_model_dir()  # weight_sync.py loads the converted model: convert it if absent
    started, load_before = time.time(), [round(x, 2) for x in os.getloadavg()]
    commit = resultfile.head_state()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(args.keep) if args.keep else Path(tmp) / "weight_sync.json"
        cmd = measure(args, raw)
        data = json.loads(raw.read_text())
    f = weight_sync_figures(data, raw.name)
    step = data["timed_step"]
    sizes = data["compress"]["steps"]
    timed, tp = sizes[step - 1], data["throughput"]
    codec_dirty = resultfile.git("status", "--porcelain", "--untracked-files=no", "--",
                                 *CODEC_CODE)
    record = {
        "about": "the delta codec's figures `traingym plan` uses by default (plan/planner.py "
                 "codec_figures); written by benchmarks/plan_figures.py from "
                 "benchmarks/weight_sync.py --sections compress,throughput; rates in bytes of "
                 "model state per second, one thread, wall clock, best of `repeat` runs",
        "figures": {"changed_fraction": f.changed_fraction,
                    "bytes_per_changed": f.bytes_per_changed,
                    "encode_bytes_per_s": f.encode_bytes_per_s,
                    "decode_bytes_per_s": f.decode_bytes_per_s,
                    "hash_bytes_per_s": f.hash_bytes_per_s},
        "measured": {
            "model": "SmolLM2-135M-Instruct (the embedded model), fp32 masters, state sent as "
                     "bf16 (lm_head tied, not counted)",
            "state_elements": timed["elements"], "state_bytes": tp["model_bytes"],
            "updates": f"{data['steps']} AdamW steps at lr {data['lr']:g} on a policy-gradient "
                       "surrogate (tests/realistic_weights.py rl_states, batch 2 x 48 tokens)",
            "timed_step": step, "changed_at_timed_step": timed["changed"],
            "frame_bytes_at_timed_step": timed["traingym_frame"],
            "methods_at_timed_step": timed["methods"],
            "changed_fraction_per_step": [r["density"] for r in sizes],
            "repeat": tp["repeat"], "threads": 1, "native_kernels": data.get("native"),
            "wall_GBps": tp["wall"], "cpu_GBps": tp["cpu"],
            "load_during_throughput": [tp["load_before"], tp["load_after"]],
        },
        "provenance": {**resultfile.provenance(started, load_before, commit),
                       "measured_by": shlex.join(["python", "benchmarks/weight_sync.py",
                                                  *cmd[2:-2]]),
                       "codec_code_dirty": bool(codec_dirty),
                       # the measuring process's, not this one's (weight_sync.py sets both)
                       "threads": {"OMP_NUM_THREADS": "1", "torch_threads": 1}},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{f.changed_fraction:.4%} changed at step {step}: {f.bytes_per_changed:.4f} B per "
          f"changed element; encode + hash {f.encode_bytes_per_s / 1e9:.3f} GB/s, decode + 2 "
          f"hashes {f.decode_bytes_per_s / 1e9:.3f} GB/s, hash {f.hash_bytes_per_s / 1e9:.2f} "
          f"GB/s\nwrote {out}")


if __name__ == "__main__":
    main()
