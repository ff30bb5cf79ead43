"""Weight sync inside the training loop: delta against full, side by side, same config.

Runs the loop (default config unless --preset/--set say otherwise) once per entry of
--codecs, in that (alternating) order, and prints per step what events.jsonl recorded: payload bytes, changed
fraction, and the sync phases (cast to the engine dtype, encode + target hash, send, receive +
verify + apply, engine update = copy into the engine's model + fused-weight refresh), then
the engine's `fused.refresh()` timed alone. Writes every run's sync events, the medians and
the full / delta ratio to a new result file with its provenance (benchmarks/resultfile.py;
BENCHMARKS.md "In the training loop").

    PYTHONPATH=src OMP_NUM_THREADS=2 .venv/bin/python benchmarks/loop_sync.py --set steps=3
        # -> benchmarks/results/loop_sync/<date>-<commit>.json
    PYTHONPATH=src OMP_NUM_THREADS=2 .venv/bin/python benchmarks/loop_sync.py --set steps=4 \
        --codecs auto,delta,full --label auto   # -> benchmarks/results/loop_sync/...-auto.json
    PYTHONPATH=src .venv/bin/python benchmarks/loop_sync.py --preset tiny --set steps=2 \
        --codecs delta,full --out /tmp/loop_sync_smoke.json                     # smoke
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import resultfile
import torch

from traingym.config.load import build_config
from traingym.loop.sync import train_loop
from traingym.observability.events import read_events
from traingym.loop.build import build_run

PHASES = ("sync_cast_s", "sync_encode_s", "sync_send_s", "sync_apply_s", "sync_engine_s")
KEPT = ("step", "sync_codec", "sync_reason", "sync_bytes", "sync_changed_frac", "seconds_sync",
        "seconds_step", *PHASES)  # the event fields the result file keeps


def one_run(preset, overrides, codec, transport, root: Path) -> tuple[list[dict], float | None]:
    cfg = build_config(preset, overrides=[*overrides, f"weights.codec={codec}",
                                          f"weights.transport={transport}",
                                          "eval.before=false", "eval.after=false"])
    run_dir = root / f"{codec}-{time.monotonic_ns()}"
    run, start = build_run(cfg, run_dir, resume=False, progress=False)
    train_loop(run, start)
    refresh_s = None
    if run.engine.fused is not None:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            run.engine.fused.refresh()
            times.append(time.perf_counter() - t0)
        refresh_s = statistics.median(times)
    run.close()
    return read_events(run_dir), refresh_s


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="default")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--transport", default="inproc")
    p.add_argument("--codecs", default="delta,full,delta,full",
                   help="runs in this order (alternate them: the machine is shared and noisy)")
    resultfile.add_args(p)
    args = p.parse_args()
    rec = resultfile.start("loop_sync", args)
    runs = []
    with tempfile.TemporaryDirectory() as root:
        for codec in args.codecs.split(","):
            runs.append((codec, *one_run(args.preset, args.overrides, codec, args.transport,
                                         Path(root))))
    cols = ("run", "step", "codec", "MB", "changed", "sync s", *(c[5:] for c in PHASES))
    print(" | ".join(cols))
    for i, (codec, events, _) in enumerate(runs):
        for e in events:
            frac = e["sync_changed_frac"]
            print(" | ".join([str(i), str(e["step"]), e["sync_codec"],
                              f"{e['sync_bytes'] / 1e6:.2f}",
                              f"{frac:.2%}" if frac is not None else "-",
                              f"{e['seconds_sync']:.3f}", *(f"{e[c]:.3f}" for c in PHASES)]))
    print()
    medians = {}
    for codec in dict.fromkeys(c for c, _, _ in runs):
        events = [e for c, ev, _ in runs if c == codec for e in ev]
        refresh = [r for c, _, r in runs if c == codec and r is not None]
        medians[codec] = statistics.median(e["seconds_sync"] for e in events)
        step = statistics.median(e["seconds_step"] for e in events)
        engine = statistics.median(e["sync_engine_s"] for e in events)
        alone = f"{statistics.median(refresh):.3f} s" if refresh else "- (no fused path)"
        print(f"{codec}: median sync {medians[codec]:.3f} s of a {step:.2f} s step "
              f"({len(events)} steps); engine update {engine:.3f} s; fused.refresh() alone "
              f"{alone}")
    ratio = medians["full"] / medians["delta"] if "delta" in medians and "full" in medians \
        else None
    if ratio is not None:
        print(f"full / delta sync time: {ratio:.2f}x")
    rec.write({
        "args": vars(args), "torch_threads": torch.get_num_threads(),
        "runs": [{"codec": codec, "refresh_alone_s": refresh,
                  "events": [{k: e[k] for k in KEPT} for e in events]}
                 for codec, events, refresh in runs],
        "median_sync_s": medians, "full_over_delta_sync_time": ratio})


if __name__ == "__main__":
    main()
