"""Sandbox execution latency and throughput, and a seeded simulation of pool sizing.

    python benchmarks/sandbox.py [--n 200]      # -> benchmarks/results/sandbox/<date>-<commit>.json
    python benchmarks/sandbox.py --n 10 --sim-s 5 --out /tmp/sandbox_smoke.json        # smoke

Part 1, side by side in one run: per-execution latency (p50/p99) of a small Python snippet for
  - bare:  `python -I -c SNIPPET` as a plain subprocess (no isolation at all),
  - cold:  a new bwrap sandbox per execution (start, run, close),
  - warm:  `SandboxPool.exec` over bwrap sandboxes (agent already running; fork per execution,
           the sandbox reset in the background after release);
and executions per second with 2 concurrent workers for each.

Part 2: a seeded discrete-event simulation of rollouts acquiring sandboxes. K rollout lanes
each loop: generate (exponential, mean --gen-s), acquire a sandbox (wait if none is ready),
hold it for a hold time drawn from the warm latencies measured in part 1, release; a released
sandbox is unavailable for a replenish time drawn from the measured cold-start times (single-
use sandboxes: the conservative case), and in a second sweep from the measured reset times
(what the pool does by default). The pool holds busy + buffer sandboxes; the sweep over
the buffer gives acquisition wait p50/p99 and the generator idle fraction (lane time spent
waiting for a sandbox). The knee is the smallest buffer whose idle fraction is within
--knee-tol of the largest buffer's; the pool's own sizing (`target_size` on the simulated
rate, mean hold and mean ready time) is compared with it.

Writes a new result file with its provenance (benchmarks/resultfile.py).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import math
import random
import statistics
import sys
import time

import resultfile

from traingym.sandbox import Limits, open_sandbox
from traingym.sandbox.pool import SandboxPool, target_size

SNIPPET = "print(sum(i * i for i in range(1000)))"
EXPECTED = str(sum(i * i for i in range(1000))).encode() + b"\n"
LIMITS = Limits(cpu_s=5, wall_s=10, memory_bytes=256 << 20, processes=16)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def bare_once() -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-I", "-c", SNIPPET,
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert out == EXPECTED and proc.returncode == 0
    return time.perf_counter() - t0


async def cold_once() -> float:
    t0 = time.perf_counter()
    sb = await open_sandbox("bwrap", LIMITS)
    try:
        r = await sb.exec(SNIPPET)
    finally:
        await sb.close()
    assert r.ok and r.stdout == EXPECTED, r
    return time.perf_counter() - t0


async def warm_once(pool) -> float:
    t0 = time.perf_counter()
    r = await pool.exec(SNIPPET)
    assert r.ok and r.stdout == EXPECTED, r
    return time.perf_counter() - t0


async def latencies(fn, n):
    return [await fn() for _ in range(n)]


async def throughput(fn, n, workers=2) -> float:
    queue = list(range(n))

    async def worker():
        while queue:
            queue.pop()
            await fn()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return n / (time.perf_counter() - t0)


async def measure(n: int) -> dict:
    pool = SandboxPool(lambda: open_sandbox("bwrap", LIMITS), min_ready=2, max_size=4)
    await pool.warm(2)
    warm = lambda: warm_once(pool)  # noqa: E731
    out = {}
    for name, fn, k in (("bare", bare_once, n), ("cold", cold_once, max(n // 5, 20)),
                        ("warm", warm, n)):
        await fn()  # warm-up
        lat = await latencies(fn, k)
        out[name] = {"n": k, "p50_ms": 1e3 * pct(lat, 0.5), "p99_ms": 1e3 * pct(lat, 0.99),
                     "samples_s": lat}
        print(f"  {name:5s} p50 {out[name]['p50_ms']:6.1f} ms  p99 {out[name]['p99_ms']:6.1f} ms",
              flush=True)
    for name, fn, k in (("bare", bare_once, n), ("cold", cold_once, max(n // 5, 20)),
                        ("warm", warm, n)):
        out[name]["exec_per_s_2_workers"] = await throughput(fn, k)
        print(f"  {name:5s} {out[name]['exec_per_s_2_workers']:6.1f} executions/s at 2 workers",
              flush=True)
    out["pool_stats"] = pool.stats()
    await pool.close()
    sb = await open_sandbox("bwrap", LIMITS)  # reset: how a pooled sandbox is made ready again
    resets = []
    for _ in range(max(n // 5, 20)):
        await sb.exec(SNIPPET)
        t0 = time.perf_counter()
        await sb.reset()
        resets.append(time.perf_counter() - t0)
    await sb.close()
    out["reset"] = {"n": len(resets), "p50_ms": 1e3 * pct(resets, 0.5),
                    "p99_ms": 1e3 * pct(resets, 0.99), "samples_s": resets}
    print(f"  reset p50 {out['reset']['p50_ms']:6.1f} ms  p99 {out['reset']['p99_ms']:6.1f} ms")
    return out


def simulate(buffer: int, busy: int, lanes: int, gen_s: float, holds: list[float],
             readies: list[float], duration_s: float, seed: int) -> dict:
    """One seeded run; returns wait p50/p99, idle fraction and the observed rate/hold/ready."""
    rng = random.Random(seed)
    ready = busy + buffer  # sandboxes ready now
    events = []  # (time, kind, lane)
    for lane in range(lanes):
        heapq.heappush(events, (rng.expovariate(1 / gen_s), 0, lane))  # 0: lane wants a sandbox
    waiting: list[tuple[float, int]] = []  # (since, lane), FIFO
    waits, total_wait, acquisitions = [], 0.0, 0
    hold_sum = ready_sum = 0.0
    while events:
        t, kind, lane = heapq.heappop(events)
        if t > duration_s:
            break
        if kind == 0:  # acquire
            acquisitions += 1
            if ready > 0:
                ready -= 1
                waits.append(0.0)
                h = rng.choice(holds)
                hold_sum += h
                heapq.heappush(events, (t + h, 1, lane))
            else:
                waiting.append((t, lane))
        elif kind == 1:  # release: the lane generates again, the sandbox replenishes
            r = rng.choice(readies)
            ready_sum += r
            heapq.heappush(events, (t + r, 2, -1))
            heapq.heappush(events, (t + rng.expovariate(1 / gen_s), 0, lane))
        else:  # a sandbox is ready again
            if waiting:
                since, w_lane = waiting.pop(0)
                waits.append(t - since)
                total_wait += t - since
                h = rng.choice(holds)
                hold_sum += h
                heapq.heappush(events, (t + h, 1, w_lane))
            else:
                ready += 1
    served = len(waits)
    return {"buffer": buffer, "wait_p50_ms": 1e3 * pct(waits, 0.5),
            "wait_p99_ms": 1e3 * pct(waits, 0.99),
            "idle_fraction": total_wait / (lanes * duration_s),
            "rate_per_s": acquisitions / duration_s, "hold_s": hold_sum / max(served, 1),
            "ready_s": ready_sum / max(served, 1)}


def sweep(holds, readies, lanes, gen_s, duration_s, seed, knee_tol) -> dict:
    mean_h = statistics.mean(holds)
    rate_guess = lanes / (gen_s + mean_h)
    busy = max(1, math.ceil(rate_guess * mean_h))  # as target_size rounds it
    top = max(8, int(3 * rate_guess * statistics.mean(readies)) + 8)
    rows = [simulate(b, busy, lanes, gen_s, holds, readies, duration_s, seed)
            for b in range(0, top + 1)]
    floor = rows[-1]["idle_fraction"]
    knee = next(r["buffer"] for r in rows if r["idle_fraction"] <= floor + knee_tol)
    ref = rows[-1]  # the pool measures rate, hold and ready time; use a well-fed run's values
    pool_busy, pool_buffer = target_size(ref["rate_per_s"], ref["hold_s"], ref["ready_s"])
    stride = max(1, len(rows) // 30)
    for r in rows[::stride]:
        print(f"  buffer {r['buffer']:3d}: wait p50 {r['wait_p50_ms']:7.2f} ms  p99 "
              f"{r['wait_p99_ms']:7.2f} ms  generator idle {100 * r['idle_fraction']:5.2f}%")
    rel = abs(pool_buffer - knee) / knee if knee else float(pool_buffer != 0)
    print(f"  knee (idle within {100 * knee_tol:.1f} pt of the floor): buffer {knee}; pool sizing: "
          f"busy {pool_busy} + buffer {pool_buffer} ({100 * rel:.0f}% from the knee)")
    return {"busy": busy, "rows": rows, "knee": knee, "pool_busy": pool_busy,
            "pool_buffer": pool_buffer, "relative_error": rel, "lanes": lanes, "gen_s": gen_s}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="executions per latency setting")
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--gen-s", type=float, default=0.3, help="mean generation time per rollout")
    ap.add_argument("--sim-s", type=float, default=120.0, help="simulated seconds per point")
    ap.add_argument("--knee-tol", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=0)
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("sandbox", args)
    print("part 1: latency and throughput", flush=True)
    measured = asyncio.run(measure(args.n))
    print("part 2: pool sizing simulation", flush=True)
    holds = measured["warm"]["samples_s"]
    sim = {}
    for name in ("cold", "reset"):  # single-use sandboxes, and reused ones (the pool's default)
        print(f" replenish = measured {name} times", flush=True)
        sim[name] = sweep(holds, measured[name]["samples_s"], args.lanes, args.gen_s, args.sim_s,
                          args.seed, args.knee_tol)
    summary = {k: {kk: vv for kk, vv in v.items() if kk != "samples_s"}
               for k, v in measured.items() if k != "pool_stats"}
    ratio = measured["warm"]["exec_per_s_2_workers"] / measured["bare"]["exec_per_s_2_workers"]
    print(f"warm pool vs bare subprocess throughput: {ratio:.2f}x")
    rec.write({"latency": summary, "throughput_ratio_warm_vs_bare": ratio,
               "pool_stats": measured["pool_stats"], "simulation": sim})


if __name__ == "__main__":
    main()
