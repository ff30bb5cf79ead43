"""`traingym tinker` as a command: prints its generated key, serves on loopback, heartbeats,
stops on SIGTERM with exit 0; refuses another interface without --api-key-env."""

import os
import re
import signal
import subprocess
import sys
import time

import httpx
from conftest import free_port

import traingym

# the subprocess imports the traingym this test imports (a checkout's src/ via PYTHONPATH too)
SRC = os.path.dirname(os.path.dirname(traingym.__file__))
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}


def test_command_serves_and_stops(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "traingym.cli", "tinker", "--port", str(port),
                             "--runs-dir", str(tmp_path / "runs")], stderr=subprocess.PIPE,
                            text=True, env=ENV)
    try:
        seen = []
        while not (found := re.search(r"API key: (tml-\S+)", seen[-1] if seen else "")):
            seen.append(proc.stderr.readline())
            assert seen[-1], f"the server exited: {''.join(seen)}"
        key = found.group(1)
        url = f"http://127.0.0.1:{port}/api/v1/"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "healthz").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.2)
        h = {"X-API-Key": key}
        sid = httpx.post(url + "create_session", headers=h, json={
            "tags": [], "user_metadata": None, "sdk_version": "0.38.0",
            "type": "create_session"}).json()["session_id"]
        beat = httpx.post(url + "session_heartbeat", headers=h,
                          json={"session_id": sid, "type": "session_heartbeat"})
        assert beat.json() == {"type": "session_heartbeat"}
        caps = httpx.get(url + "get_server_capabilities", headers=h).json()
        assert [m["model_name"] for m in caps["supported_models"]] == ["tiny", "embedded"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        assert code == 0, proc.stderr.read()


def test_other_interface_needs_a_key_variable():
    out = subprocess.run([sys.executable, "-m", "traingym.cli", "tinker", "--host", "0.0.0.0"],
                         capture_output=True, text=True, env=ENV)
    assert out.returncode == 2 and "--api-key-env" in out.stderr
    out = subprocess.run([sys.executable, "-m", "traingym.cli", "tinker", "--api-key-env",
                          "NOPE_X"], capture_output=True, text=True, env={**ENV, "NOPE_X": "abc"})
    assert out.returncode == 2 and "tml-" in out.stderr
