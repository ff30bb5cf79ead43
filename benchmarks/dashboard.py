"""The dashboard on a large run: the run page's API calls and a samples query, timed, and the
server's memory while a live run appends.

    python benchmarks/dashboard.py [--steps 10000] [--samples 100000] [--repeats 20]
        [--live-s 60] [--label L]      # -> benchmarks/results/dashboard/<date>-<commit>.json
    python benchmarks/dashboard.py --steps 200 --samples 1000 --repeats 2 --live-s 3 \\
        --out /tmp/dashboard.json      # smoke

1. Writes a synthetic run directory (a temporary folder): config.json, events.jsonl with
   --steps records carrying the key set of a tiny run's events (EVENT_KEYS below, copied from
   `traingym train --preset tiny` events.jsonl, sync and async keys) and samples.jsonl with
   --samples records (prompt, completion of 40-400 characters, reward, step, sid).
2. Starts `traingym dashboard` (the real command, a subprocess) on it; the first requests
   (reading events.jsonl, the charted keys' sums, reading samples.jsonl) are timed on their
   own (`cold`).
3. Times, --repeats times each, interleaved: the run page's calls as static/run.js makes them
   (GET /api/runs/{id}, GET /api/runs/{id}/series with the charted keys of static/charts.js,
   GET /api/runs/{id}/events?after=last-1), summed per repeat; and a samples query (search +
   filter: `q` a word of the completions, min_reward, a page of 50). Reports medians (target
   for each: < 1 s).
4. Live phase (--live-s): a writer appends one step and 10 samples every 0.1 s while a client
   polls events?after=last and a samples query every 0.5 s (as the page does, faster); the
   server's RSS (/proc/PID/status VmRSS) is sampled every second. Reports RSS at the start
   and end of the phase, the least-squares slope (MiB per minute), the bytes appended, and
   the poll latencies.

The server process imports torch at start-up (traingym.cli imports traingym.config.schema, which
imports the rollout registry), so its RSS includes torch's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import resultfile

ROOT = Path(__file__).resolve().parents[1]
CHARTS_JS = ROOT / "src/traingym/dashboard/static/charts.js"
EVENT_KEYS = [  # a tiny run's events.jsonl keys (sync run, plus the async run's async_* keys)
    "reward_mean", "reward_std", "loss", "kl", "entropy", "clip_frac", "mismatch_abs_logp",
    "mismatch_kl_k3", "grad_norm", "trained_tokens", "lr", "completion_len_mean",
    "completion_len_max", "turns_mean", "groups", "groups_kept", "groups_dropped",
    "gen_tokens", "gen_tokens_per_s", "tokens_per_s", "seconds_rollout", "seconds_train",
    "seconds_sync", "seconds_checkpoint", "seconds_step", "checkpoint_saved", "policy_version",
    "elapsed_s", "sync_version", "sync_codec", "sync_reason", "sync_bytes", "sync_full_bytes",
    "sync_changed_frac", "sync_corrupt", "sync_resyncs", "sync_cast_s", "sync_encode_s",
    "sync_send_s", "sync_apply_s", "sync_engine_s", "sync_publish_s", "async_staleness_mean",
    "async_staleness_max", "async_dropped", "async_out", "trainer_idle_frac"]
WORDS = ("the answer is about seven because we add three and four then carry the one "
         "so that result holds").split()


def event(step: int, rng: random.Random) -> dict:
    rec = {}
    for k in EVENT_KEYS:
        rec[k] = rng.random()
    rec.update(step=step, reward_mean=min(1.0, step / 10000 + rng.random() * 0.1),
               checkpoint_saved=step % 100 == 0, policy_version=step - 1, sync_version=step,
               sync_codec="delta" if step % 8 else "full", sync_reason="delta",
               sync_bytes=rng.randrange(10**5, 10**6), sync_full_bytes=538_000_000,
               trained_tokens=64, groups=4, groups_kept=4, groups_dropped=0, sync_corrupt=0,
               sync_resyncs=0, async_dropped=0, async_out=4, prompt_indices=[0, 1, 2, 3])
    return rec


def sample(step: int, i: int, rng: random.Random) -> dict:
    a, b = rng.randrange(100), rng.randrange(100)
    words = rng.choices(WORDS, k=rng.randrange(8, 80))
    return {"sid": f"s{i}", "step": step,
            "prompt": f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n",
            "completion": " ".join(words) + f" {a + b}", "reward": round(rng.random(), 3),
            "example": {"prompt": f"What is {a} + {b}?", "answer": a + b}}


def write_run(run: Path, steps: int, samples: int, rng: random.Random) -> None:
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({
        "seed": 0, "steps": steps * 2, "mode": "sync", "model": {"path": "tiny"},
        "task": {"name": "arith"}, "rollout": {"engine": "torch"},
        "algorithm": {"name": "grpo"}}))
    per_step = max(1, samples // steps)
    with open(run / "events.jsonl", "w") as ev, open(run / "samples.jsonl", "w") as sf:
        for s in range(1, steps + 1):
            ev.write(json.dumps(event(s, rng)) + "\n")
        for i in range(samples):
            sf.write(json.dumps(sample(1 + i // per_step, i, rng)) + "\n")


def charted_keys() -> list[str]:
    text = CHARTS_JS.read_text() if CHARTS_JS.exists() else ""
    keys = re.findall(r'key: "([A-Za-z0-9_]+)"', text)
    for group in re.findall(r"from: \[([^\]]*)\]", text):
        keys += re.findall(r'"([A-Za-z0-9_]+)"', group)
    keys = list(dict.fromkeys(keys))
    return keys or ["reward_mean", "reward_std", "loss", "kl", "entropy", "tokens_per_s"]


class Client:
    def __init__(self, port: int):
        self.port = port

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def json(self, path: str) -> dict:
        status, body = self.get(path)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {body[:300]!r}")
        return json.loads(body)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def slope_per_min(points: list[tuple[float, float]]) -> float:
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / den if den else 0.0


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--samples", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--live-s", type=float, default=60.0)
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("dashboard", args)
    rng = random.Random(0)
    tmp = Path(tempfile.mkdtemp(prefix="dashboard-bench-"))
    run = tmp / "runs" / "big"
    t = time.perf_counter()
    write_run(run, args.steps, args.samples, rng)
    write_s = time.perf_counter() - t
    sizes = {f: (run / f).stat().st_size for f in ("events.jsonl", "samples.jsonl")}
    print(f"wrote {args.steps} steps, {args.samples} samples ({sizes}) in {write_s:.1f} s",
          flush=True)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "traingym.cli", "dashboard",
                             str(tmp / "runs"), "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    c = Client(port)
    result: dict = {}
    try:
        t0 = time.perf_counter()
        while True:
            if proc.poll() is not None:
                raise RuntimeError((tmp / "server.log").read_text())
            try:
                if c.get("/api/evals")[0] == 200:  # answers without reading the run
                    break
            except OSError:
                time.sleep(0.2)
        start_s = time.perf_counter() - t0
        rss_idle = rss_mib(proc.pid)
        keys = charted_keys()
        series_url = f"/api/runs/big/series?keys={','.join(keys)}&max_points=2000"
        cold = {"runs_list_s": timed(lambda: c.json("/api/runs")),  # reads events.jsonl
                "series_first_s": timed(lambda: c.json(series_url)),  # per-key sums made
                "samples_first_query_s": timed(lambda: c.json("/api/runs/big/samples?limit=50"))}
        rss_loaded = rss_mib(proc.pid)

        def run_page():
            info = c.json("/api/runs/big")
            series = c.json(series_url)
            last = series["step"][-1]
            c.json(f"/api/runs/big/events?after={last - 1}")
            assert info["step"] == last and len(series["step"]) <= 2000

        queries = ["answer is", "carry the one", "seven because", "holds 42", "then carry"]

        def samples_query(i: int):
            q = queries[i % len(queries)].replace(" ", "%20")
            ans = c.json(f"/api/runs/big/samples?q={q}&min_reward=0.5&limit=50")
            assert ans["total"] >= 0

        page_s, query_s = [], []
        for i in range(args.repeats):
            page_s.append(timed(run_page))
            query_s.append(timed(lambda: samples_query(i)))
        result["timed"] = {
            "run_page_median_s": statistics.median(page_s), "run_page_max_s": max(page_s),
            "samples_query_median_s": statistics.median(query_s),
            "samples_query_max_s": max(query_s), "repeats": args.repeats,
            "run_page_calls": ["/api/runs/big", f"series ({len(keys)} keys, max_points 2000)",
                               "events?after=last-1"],
            "charted_keys": keys,
            "samples_query": "q=<phrase>&min_reward=0.5&limit=50, phrases: " + "; ".join(queries),
            "under_1s": statistics.median(page_s) < 1 and statistics.median(query_s) < 1}
        print(json.dumps(result["timed"], indent=1), flush=True)

        # live phase
        stop = threading.Event()
        appended = {"steps": 0, "samples": 0}

        def writer():
            step, i = args.steps, args.samples
            wrng = random.Random(1)
            while not stop.is_set():
                step += 1
                with open(run / "events.jsonl", "a") as f:
                    f.write(json.dumps(event(step, wrng)) + "\n")
                with open(run / "samples.jsonl", "a") as f:
                    for _ in range(10):
                        f.write(json.dumps(sample(step, i, wrng)) + "\n")
                        i += 1
                appended["steps"] += 1
                appended["samples"] += 10
                time.sleep(0.1)

        rss_points, poll_s, seen = [], [], args.steps
        size0 = sum((run / f).stat().st_size for f in ("events.jsonl", "samples.jsonl"))
        w = threading.Thread(target=writer)
        t_live = time.perf_counter()
        w.start()
        next_rss = 0.0
        while (now := time.perf_counter() - t_live) < args.live_s:
            if now >= next_rss:
                rss_points.append((now, rss_mib(proc.pid)))
                next_rss += 1.0
            t = time.perf_counter()
            ans = c.json(f"/api/runs/big/events?after={seen}")
            seen = ans["last"]
            c.json("/api/runs/big/samples?q=carry&min_reward=0.5&limit=50")
            poll_s.append(time.perf_counter() - t)
            time.sleep(0.5)
        stop.set()
        w.join()
        time.sleep(0.6)
        final = c.json(f"/api/runs/big/events?after={seen}")
        seen = final["last"] if final["events"] else seen
        rss_points.append((time.perf_counter() - t_live, rss_mib(proc.pid)))
        size1 = sum((run / f).stat().st_size for f in ("events.jsonl", "samples.jsonl"))
        result["live"] = {
            "seconds": args.live_s, "steps_appended": appended["steps"],
            "samples_appended": appended["samples"], "bytes_appended": size1 - size0,
            "last_step_seen": seen, "last_step_written": args.steps + appended["steps"],
            "rss_start_mib": rss_points[0][1], "rss_end_mib": rss_points[-1][1],
            "rss_max_mib": max(v for _, v in rss_points),
            "rss_slope_mib_per_min": slope_per_min(rss_points),
            "poll_median_s": statistics.median(poll_s), "poll_max_s": max(poll_s),
            "polls": len(poll_s), "rss_samples": [[round(t, 1), round(v, 1)]
                                                  for t, v in rss_points]}
        print(json.dumps({k: v for k, v in result["live"].items() if k != "rss_samples"},
                         indent=1), flush=True)
        result.update(server_start_s=start_s, cold=cold, rss_idle_mib=rss_idle,
                      rss_after_index_mib=rss_loaded)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log.close()
        server_log = (tmp / "server.log").read_text()
        shutil.rmtree(tmp)
    result.update(
        data={"steps": args.steps, "samples": args.samples, "event_keys": len(EVENT_KEYS) + 2,
              "bytes": sizes, "write_s": write_s},
        server_exit_code=code, server_log_tail=server_log[-500:])
    rec.write(result)


if __name__ == "__main__":
    main()
