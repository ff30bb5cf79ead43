"""The bind and key rules and the shutdown of `traingym serve` (real subprocesses):
127.0.0.1 by default; a non-loopback host without a key is refused before anything loads;
SIGTERM answers the request in flight, then exits 0."""

import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from conftest import Server


def _serve(*args, env=None):
    return subprocess.run([sys.executable, "-m", "traingym.cli", "serve", "tiny", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_non_loopback_without_key_is_refused():
    r = _serve("--host", "0.0.0.0")
    assert r.returncode == 2
    assert "--api-key-env" in r.stderr and "0.0.0.0" in r.stderr


def test_empty_key_variable_is_refused():
    r = _serve("--host", "0.0.0.0", "--api-key-env", "TRAINGYM_NO_SUCH_VAR")
    assert r.returncode == 2
    assert "TRAINGYM_NO_SUCH_VAR" in r.stderr


def _other_address() -> str | None:
    """A non-loopback address of this machine, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_default_bind_loopback_and_sigterm_finishes_in_flight(tmp_path):
    server = Server("tiny", log=tmp_path / "serve.log")
    assert "http://127.0.0.1:" in (tmp_path / "serve.log").read_text()
    other = _other_address()
    if other is not None:  # the port is closed on the machine's other interface
        with pytest.raises(OSError):
            socket.create_connection((other, server.port), timeout=5).close()
    result = {}

    def long_request():
        result["r"] = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
            "model": "tiny", "max_tokens": 200, "temperature": 1.0, "seed": 1,
            "messages": [{"role": "user", "content": "Count."}]})

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 60
    while httpx.get(server.url + "/health").json()["in_flight"] == 0:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.01)
    code = server.stop(timeout=120)
    t.join(60)
    assert code == 0, (tmp_path / "serve.log").read_text()[-2000:]
    r = result["r"]
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
    assert "traingym serve: stopped" in (tmp_path / "serve.log").read_text()
