"""procs.py, the process helpers of the servers traingym starts: stop_group ends a process
group whose members ignore SIGTERM within its bound (SIGKILL after term_s), log_tail's line
and character cuts and its missing-file answer, wait_healthy taking an empty 2xx answer,
naming an exited process's code, and giving up after its timeout with the last failure."""

from __future__ import annotations

import asyncio
import http.server
import subprocess
import sys
import threading
import time

import pytest

from traingym.core.procs import (NotHealthy, free_port, log_tail, stop_group, wait_healthy,
                            wait_healthy_async)

STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_stop_group_kills_a_group_that_ignores_sigterm():
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    t0 = time.monotonic()
    stop_group(proc, term_s=0.5, kill_s=5.0)
    assert time.monotonic() - t0 < 5.0
    assert proc.returncode == -9
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # the child, reparented, is reaped by init
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().split()[2] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the group's child {child} survived stop_group")
    stop_group(proc, 0.5, 0.5)  # an exited process: returns at once
    stop_group(None, 0.5, 0.5)


LEADER_EXITS = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import os, signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(os.getpid(), flush=True); "
    "time.sleep(60)"])  # says its pid once it ignores SIGTERM
time.sleep(60)
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("leader", ["exits on SIGTERM", "already exited"])
def test_stop_group_kills_members_that_outlive_the_leader(leader):
    proc = subprocess.Popen([sys.executable, "-c", LEADER_EXITS], stdout=subprocess.PIPE,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    if leader == "already exited":  # as a crashed launcher leaves its workers
        proc.kill()
        proc.wait(5)
    stop_group(proc, term_s=5.0, kill_s=5.0)
    assert _gone(child, 5.0), f"the group's child {child} survived its leader's stop"


def test_log_tail(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    assert log_tail(log, lines=2) == "line 8\nline 9"
    assert log_tail(log, chars=7) == "line 9\n"
    assert log_tail(tmp_path / "absent.log", lines=3) == "(no log)"
    assert log_tail(None, lines=3, missing="") == ""


class _Empty200(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200 if self.path == "/health" else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_wait_healthy_takes_an_empty_2xx_and_names_failures():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Empty200)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        wait_healthy(base + "/health", None, timeout_s=5.0)
        asyncio.run(wait_healthy_async(base + "/health", None, timeout_s=5.0))
        with pytest.raises(NotHealthy, match="503") as info:
            wait_healthy(base + "/other", None, timeout_s=0.5, interval_s=0.1)
        assert info.value.exited is None
    finally:
        server.shutdown()
        server.server_close()
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])
    dead.wait()
    with pytest.raises(NotHealthy) as info:
        wait_healthy(f"http://127.0.0.1:{free_port()}/health", dead, timeout_s=5.0)
    assert info.value.exited == 4
