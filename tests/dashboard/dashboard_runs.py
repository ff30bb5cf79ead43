"""Helpers for the dashboard tests: synthetic run directories (the files `traingym train`
writes, no training) and `traingym dashboard` as a real subprocess on a free port, with raw
HTTP requests (http.client: paths go out exactly as given, never normalised)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

# the keys of a tiny sync run's events.jsonl (traingym train --preset tiny)
EVENT_KEYS = ["reward_std", "loss", "kl", "entropy", "clip_frac", "mismatch_abs_logp",
              "mismatch_kl_k3", "grad_norm", "trained_tokens", "lr", "completion_len_mean",
              "completion_len_max", "turns_mean", "groups", "groups_kept", "groups_dropped",
              "gen_tokens", "gen_tokens_per_s", "tokens_per_s", "seconds_rollout",
              "seconds_train", "seconds_sync", "seconds_checkpoint", "seconds_step",
              "policy_version", "sync_version", "sync_bytes", "sync_full_bytes",
              "sync_changed_frac", "sync_encode_s", "sync_send_s", "sync_apply_s", "elapsed_s"]


def config(steps: int = 10, **extra) -> dict:
    return {"seed": 0, "steps": steps, "mode": "sync",
            "model": {"path": "tiny", "engine_dtype": "float32"},
            "task": {"name": "arith"}, "rollout": {"engine": "torch", "max_new_tokens": 4},
            "algorithm": {"name": "grpo"}, "observability": {"sinks": []}, **extra}


def event(step: int, **over) -> dict:
    rec = {"step": step, "reward_mean": step / 100}
    rec.update({k: float(step) for k in EVENT_KEYS})
    rec.update(sync_codec="delta" if step % 2 else "full", sync_bytes=100 * step,
               sync_full_bytes=1000, checkpoint_saved=False, **over)
    return rec


def sample(step: int, k: int, **over) -> dict:
    return {"step": step, "prompt": f"What is {step} + {k}?", "completion": f"answer {step + k}",
            "reward": k / 4, "example": {"prompt": f"What is {step} + {k}?", "answer": step + k},
            **over}


def write_jsonl(path: Path, records, mode: str = "w") -> None:
    with open(path, mode) as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def make_run(root: Path, name: str, steps: int = 5, total: int = 10, per_step: int = 4,
             finished: bool = False, **cfg) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config(total, **cfg)))
    write_jsonl(run / "events.jsonl", [event(s) for s in range(1, steps + 1)])
    write_jsonl(run / "samples.jsonl", [sample(s, k) for s in range(steps)
                                        for k in range(per_step)])
    if finished:
        (run / "results.json").write_text(json.dumps({
            "final": event(steps), "eval": {"target_metric": "sampled", "delta": {
                "sampled": {"delta": 0.05, "se": 0.01, "z": 5.0}}}}))
    return run


def make_eval(root: Path, name: str, n: int = 6) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "model": "tiny", "engine": "torch", "config": config(api_key="sk-in-eval-summary"),
        "scores": {"greedy": {"mean": 0.25, "se": 0.1}, "sampled": {"mean": 0.5, "se": 0.1}}}))
    write_jsonl(folder / "samples.jsonl", [{"mode": "sampled", "prompt_index": i,
                                           "prompt": f"eval prompt {i}", "completion": f"c{i}",
                                           "reward": i / n} for i in range(n)])
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    port: int

    def wait(self, alive, describe) -> None:
        deadline = time.monotonic() + 120
        auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        while True:
            if not alive():
                raise RuntimeError(f"the dashboard stopped: {describe()}")
            try:
                if self.get("/api/runs", headers=auth)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the dashboard did not answer: {describe()}")
            time.sleep(0.1)

    def request(self, method: str, path: str, headers: dict | None = None,
                host: str | None = None):
        """(status, headers as a lower-cased dict, body bytes); the path is sent as given."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", f"127.0.0.1:{self.port}" if host is None else host)
            for k, v in (headers or {}).items():
                conn.putheader(k, v)
            conn.endheaders()
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def get(self, path: str, headers: dict | None = None, host: str | None = None):
        return self.request("GET", path, headers, host)


class Server(Client):
    """`traingym dashboard RUNS_DIR ...` in a subprocess, waited for on /api/runs."""

    def __init__(self, runs_dir: Path, *args: str, env: dict | None = None, log: Path,
                 token: str | None = None):
        self.port, self.log, self.token = free_port(), log, token
        cmd = [sys.executable, "-m", "traingym.cli", "dashboard", str(runs_dir),
               "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        self.wait(lambda: self.proc.poll() is None,
                  lambda: f"exit {self.proc.returncode}: {log.read_text()[-3000:]}")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class ThreadServer(Client):
    """The dashboard app under uvicorn in a thread of this process (no CLI start-up)."""

    def __init__(self, runs_dir: Path, token: str | None = None, host: str = "127.0.0.1"):
        import uvicorn

        from traingym.dashboard import security
        from traingym.dashboard.app import build_app

        self.port, self.token = free_port(), token
        app = build_app(runs_dir, token, security.allowed_hosts(host))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", server_header=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.wait(self.thread.is_alive, lambda: "the server thread ended")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
