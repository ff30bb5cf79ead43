"""How often a Tinker SDK client process dies as it exits, by HTTP transport and by whether it
closed its ServiceClient: examples/tinker/rl_loop.py run many times against `traingym tinker`.

Why: with tinker 0.38 (pyqwest 0.12) on Python 3.11, the SDK's default HTTP transport is
pyqwest, whose Rust threads hand each response to the SDK's asyncio loop from outside Python.
One that lands while the client's interpreter is finalizing asks for the GIL, CPython ends that
thread with pthread_exit, and the unwind through Rust frames aborts the process (SIGABRT,
exit -6, often with nothing on stderr; the pyo3/CPython issue that Python 3.14 changes to a
hang). The server turns the SDK's session futures poller on (sample_use_retrieve_futures), and
that poller keeps a long-poll of up to `poll_s` in flight until the ServiceClient is closed,
so a script that just returns can have a response land during its exit.

Two servers (subprocesses, the tiny model, `poll_s` --poll-s: shorter than the default 10 s
makes a landing during exit likelier, so the difference shows in fewer runs), one per
`client_pyqwest` setting (what the server's client config says in `use_pyqwest_transport`).
Four variants, run in turn --runs times each (round robin, so load drifts alike): transport
pyqwest or httpx x the example as shipped (`with tinker.ServiceClient(...)`, closed at the
end) or its train() on a client never closed (as the cookbook's trainers leave theirs). Each
run is one client process (.venv-tinker's interpreter: tinker, no traingym): 2 steps of 4
prompts x 4 completions of 8 tokens, 4 held-out prompts before and after. Reported per
variant: runs, exit codes, and the median wall time of a run (start to exit).

    .venv/bin/python benchmarks/tinker_client_exit.py     # -> results/tinker_client_exit/...
    .venv/bin/python benchmarks/tinker_client_exit.py --runs 2 --out /tmp/exit_smoke.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import resultfile
from tinker_rl import (EXAMPLE, add_client_python, client_interpreter, client_versions,
                       free_port, wait_healthy)

KEY_VAR = "TRAINGYM_BENCH_TINKER_KEY"
# examples/tinker/rl_loop.py's train() on a ServiceClient that is never closed.
UNCLOSED = ("import sys, tinker; sys.path.insert(0, sys.argv[1]); import rl_loop; "
            "a = rl_loop.parse_args(sys.argv[2:]); "
            "rl_loop.train(tinker.ServiceClient(base_url=a.base_url), a)")


def start_server(tmp: Path, name: str, pyqwest: bool, poll_s: float, runs: int, key: str):
    config = tmp / f"{name}.json"
    # Unclosed clients keep their training clients until the session times out (120 s).
    config.write_text(json.dumps({"tinker": {
        "models": ["tiny"], "runs_dir": str(tmp / name), "poll_s": poll_s,
        "client_pyqwest": pyqwest, "max_training_clients": 2 * runs + 4}}))
    port = free_port()
    env = {**os.environ, KEY_VAR: key, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(resultfile.ROOT / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    log = tmp / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "traingym.cli", "tinker", str(config),
                                 "--port", str(port), "--api-key-env", KEY_VAR],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log)
    return proc, url


def run_once(client: str, closed: bool, url: str, tmp: Path, env: dict) -> dict:
    args = ["--base-url", url, "--model", "tiny", "--steps", "2", "--batch-size", "4",
            "--group-size", "4", "--max-tokens", "8", "--eval-prompts", "4",
            "--reward", "digits", "--out", str(tmp / "rl.json")]
    cmd = [client, str(EXAMPLE), *args] if closed else \
        [client, "-c", UNCLOSED, str(EXAMPLE.parent), *args]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env, timeout=600,
                       check=False)
    row = {"rc": p.returncode, "wall_s": round(time.perf_counter() - t0, 3)}
    if p.returncode != 0:
        row["signal"] = signal.Signals(-p.returncode).name if p.returncode < 0 else None
        row["stderr_tail"] = p.stderr[-400:]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="client runs per variant")
    p.add_argument("--poll-s", type=float, default=0.5, help="the servers' poll_s")
    add_client_python(p)
    resultfile.add_args(p)
    a = p.parse_args()
    rec = resultfile.start("tinker_client_exit", a)
    client = client_interpreter(a.client_python)
    key = "tml-bench-" + os.urandom(12).hex()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(TINKER_API_KEY=key, OMP_NUM_THREADS="1")
    variants = [(t, c) for t in ("pyqwest", "httpx") for c in ("closed", "unclosed")]
    rows: dict = {f"{t}/{c}": [] for t, c in variants}
    with tempfile.TemporaryDirectory(prefix="tinker_exit_") as tmp:
        tmp = Path(tmp)
        servers = {t: start_server(tmp, t, t == "pyqwest", a.poll_s, a.runs, key)
                   for t in ("pyqwest", "httpx")}
        try:
            for i in range(a.runs):
                for t, c in variants:
                    row = run_once(client, c == "closed", servers[t][1], tmp, env)
                    rows[f"{t}/{c}"].append(row)
                    print(i, f"{t}/{c}", row["rc"], row["wall_s"], flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)
    summary = {name: {"runs": len(r), "failed": sum(x["rc"] != 0 for x in r),
                      "exit_codes": dict(collections.Counter(str(x["rc"]) for x in r)),
                      "wall_s_median": statistics.median(x["wall_s"] for x in r)}
               for name, r in rows.items()}
    result = {"client_python": client, "client_versions": client_versions(client),
              "poll_s": a.poll_s, "summary": summary, "runs": rows}
    print(json.dumps(summary, indent=1))
    rec.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
