"""`traingym serve` throughput: 16 concurrent clients against one request at a time.

Starts `traingym serve MODEL` (default: the embedded SmolLM2-135M-Instruct) as a subprocess,
sends the same N chat requests (default 32, greedy, 16-32 new tokens each, end-of-turn
allowed) first one at a time, then from 16 concurrent clients, and reports for each: wall
time, completion tokens per second, requests per second, p50/p99 latency; the throughput
ratio (concurrent / one at a time; target >= 4x); whether every greedy answer was the same
both ways; the server's batching counters (continuous batching on the built-in engine: decode
steps and most rows live at once; dynamic batching on other engines: engine calls and most
requests in one call). Writes a new result file with its provenance (benchmarks/resultfile.py:
the load average before and after, the commit, ...).

    .venv/bin/python benchmarks/serve.py [--model embedded] [--requests 32] [--clients 16]
        [--set model.engine_dtype=float32 --label fp32]
        # -> benchmarks/results/serve/<date>-<commit>[-fp32].json
    .venv/bin/python benchmarks/serve.py --model tiny --requests 4 --clients 2 \
        --out /tmp/serve_smoke.json                                   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

import resultfile
from serving import serving


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def requests(n: int, model: str) -> list[dict]:
    ops = ["+", "-", "*"]
    return [{"model": model, "temperature": 0, "max_tokens": 16 + (i * 7) % 17,
             "messages": [{"role": "user", "content": f"What is {3 + i % 7} {ops[i % 3]} "
                                                      f"{2 + (i * 5) % 9}? Explain briefly."}]}
            for i in range(n)]


async def run(url: str, reqs: list[dict], clients: int):
    import httpx

    queue = list(enumerate(reqs))
    out: dict[int, tuple[float, dict]] = {}

    async def worker(client):
        while queue:
            i, body = queue.pop(0)
            t0 = time.perf_counter()
            r = await client.post(url + "/v1/chat/completions", json=body)
            r.raise_for_status()
            out[i] = (time.perf_counter() - t0, r.json())

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=3600) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    wall = time.perf_counter() - t0
    lat = [out[i][0] for i in range(len(reqs))]
    answers = [out[i][1]["choices"][0]["message"]["content"] for i in range(len(reqs))]
    tokens = sum(out[i][1]["usage"]["completion_tokens"] for i in range(len(reqs)))
    return {"clients": clients, "wall_s": wall, "completion_tokens": tokens,
            "tokens_per_s": tokens / wall, "requests_per_s": len(reqs) / wall,
            "latency_p50_s": statistics.median(lat), "latency_p99_s": percentile(lat, 0.99),
            "latency_max_s": max(lat)}, answers


def main() -> int:
    import httpx

    p = argparse.ArgumentParser()
    p.add_argument("--model", default="embedded")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--clients", type=int, default=16)
    resultfile.add_args(p)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="passed to `traingym serve --set`, e.g. model.engine_dtype=float32")
    a = p.parse_args()
    rec = resultfile.start("serve", a)
    sets = [x for kv in a.overrides for x in ("--set", kv)]
    with serving(a.model, sets, prefix="serve_bench_") as server:
        url, model = server.url, server.model
        reqs = requests(a.requests, model)
        asyncio.run(run(url, reqs[:2], 1))  # warm-up: first calls pay one-off costs
        stats_start = httpx.get(url + "/health").json()["batching"]
        one, answers_one = asyncio.run(run(url, reqs, 1))
        stats_before = httpx.get(url + "/health").json()["batching"]
        many, answers_many = asyncio.run(run(url, reqs, a.clients))
        stats_after = httpx.get(url + "/health").json()["batching"]
    code = server.exit_code
    mode = stats_after.get("mode", "dynamic")
    if mode == "continuous":  # built-in engine: decode steps for all live rows
        batching = {"concurrent_decode_steps": stats_after["steps"] - stats_before["steps"],
                    "one_at_a_time_decode_steps": stats_before["steps"] - stats_start["steps"],
                    "max_live_rows": stats_after["max_live_rows"],
                    "rows_retired_early": stats_after["retired_early"]}
    else:
        calls = stats_after["engine_calls"] - stats_before["engine_calls"]
        batching = {"concurrent_engine_calls": calls,
                    "concurrent_requests_per_call": a.requests / calls if calls else None,
                    "max_requests_per_call": stats_after["max_requests_per_call"]}
    result = {
        "model": a.model, "server_overrides": a.overrides, "requests": a.requests,
        "max_tokens": "16 + (7 i mod 17), greedy",
        "one_at_a_time": one, "concurrent": many,
        "throughput_ratio": many["tokens_per_s"] / one["tokens_per_s"],
        "target_ratio": 4.0,
        "same_answers": answers_one == answers_many,
        "differing_answers": sum(x != y for x, y in zip(answers_one, answers_many)),
        "batching_mode": mode, **batching,
        "server_exit_code": code,
        "torch_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(json.dumps(result, indent=1))
    rec.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
