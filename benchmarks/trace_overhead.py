"""What tracing costs (core/trace.py): tiny-preset sync runs with
`observability.trace` on and off, alternated round by round in one process (this machine is
shared and noisy, so the two are measured side by side), median of the rounds.

Per run: the wall seconds of `traingym.train` and the sum of the step records'
`seconds_step` (the loop alone: no model load, no merge); per setting the median over
--rounds; the cost of one span measured alone (20,000 spans, off and on) and that cost times
the spans per step as a fraction of the untraced step; the ratio on/off of both medians and the median of the per-round ratios; the
trace's span count per step; in a new result file whose provenance (benchmarks/resultfile.py)
has the commit, load average before and after, the command.

    PYTHONPATH=src .venv/bin/python benchmarks/trace_overhead.py            # ~2 minutes
        # -> benchmarks/results/trace_overhead/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/trace_overhead.py --rounds 3 --out /tmp/t.json

Not covered: async runs (engine processes write their own shards the same way, one write
per span), data-parallel ranks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import resultfile


def run_one(trace_on: bool, steps: int, work: Path) -> dict:
    import traingym
    from traingym.observability.events import read_events

    cfg = traingym.build_config("tiny", overrides={
        "steps": steps, "threads": 1, "observability": {"trace": trace_on},
        "eval": {"before": False, "after": False}})
    run_dir = work / f"{'on' if trace_on else 'off'}-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    traingym.train(cfg, run_dir=run_dir, progress=False)
    wall = time.perf_counter() - t0
    events = read_events(run_dir)
    spans = 0
    if trace_on:
        doc = json.loads((run_dir / "trace.json").read_text())
        spans = sum(e["ph"] == "X" for e in doc["traceEvents"])
    return {"wall_s": wall, "loop_s": sum(e["seconds_step"] for e in events),
            "spans_per_step": spans / steps}


def span_cost_us(work: Path, n: int = 20000) -> dict:
    """Microseconds per span, off and on (one JSON line written and flushed each)."""
    from traingym.core import trace

    def timed() -> float:
        t0 = time.perf_counter()
        for i in range(n):
            with trace.span("x", cat="bench", i=i):
                pass
        return (time.perf_counter() - t0) / n * 1e6

    off = timed()
    trace.start(work / "spans", "bench")
    try:
        on = timed()
    finally:
        trace.stop()
    return {"off_us": off, "on_us": on}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=4)
    resultfile.add_args(p)
    a = p.parse_args()
    rec = resultfile.start("trace_overhead", a)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        run_one(True, 1, Path(tmp))  # warm-up: imports, the model cache
        for r in range(a.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {on: run_one(on, a.steps, Path(tmp)) for on in order}
            rounds.append({"on": got[True], "off": got[False]})
            print(f"round {r + 1}: loop on {got[True]['loop_s']:.2f} s, off "
                  f"{got[False]['loop_s']:.2f} s", flush=True)
        cost = span_cost_us(Path(tmp))
    med = {k: {s: statistics.median(x[s][k] for x in rounds) for s in ("on", "off")}
           for k in ("wall_s", "loop_s")}
    out = {
        "rounds": rounds, "steps": a.steps, "median": med,
        "ratio_loop_on_off": med["loop_s"]["on"] / med["loop_s"]["off"],
        "ratio_wall_on_off": med["wall_s"]["on"] / med["wall_s"]["off"],
        "median_round_ratio_loop": statistics.median(x["on"]["loop_s"] / x["off"]["loop_s"]
                                                     for x in rounds),
        "spans_per_step": rounds[0]["on"]["spans_per_step"],
        "span_cost": cost,
        "span_cost_per_step_frac": cost["on_us"] * rounds[0]["on"]["spans_per_step"] / 1e6
        / (med["loop_s"]["off"] / a.steps),
    }
    rec.write(out)
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))


if __name__ == "__main__":
    main()
