"""`traingym serve` as a subprocess for the serving benchmarks (serve.py, serve_hostile.py): a
free local port, the server's output in a log file, the wait until /v1/models answers, and a
SIGTERM at the end (the exit code lands in `Server.exit_code`)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    url: str
    model: str  # the id /v1/models reports
    log: str
    exit_code: int | None = None


@contextlib.contextmanager
def serving(model: str, extra: list[str] = (), env: dict | None = None, prefix: str = "serve_",
            start_timeout_s: float = 600):
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w", prefix=prefix, suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "traingym.cli", "serve", model, "--port",
                             str(port), *extra], stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, port, url, "", log.name)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                server.model = httpx.get(url + "/v1/models", timeout=5).json()["data"][0]["id"]
                break
            except (httpx.TransportError, ValueError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start; see {log.name}") from None
                time.sleep(1)
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        server.exit_code = proc.wait(120)
        log.close()
