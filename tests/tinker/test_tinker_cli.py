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


def test_config_file_section_and_flags(tmp_path):
    from traingym.core.errors import ConfigError
    from traingym.tinker.server import load_config

    f = tmp_path / "t.toml"
    f.write_text('steps = 3\n[tinker]\nport = 9001\nmodels = ["tiny"]\nmax_lora_rank = 8\n')
    cfg = load_config(str(f))
    assert (cfg.port, cfg.models, cfg.max_lora_rank) == (9001, ["tiny"], 8)

    class Args:
        host, port, api_key_env, runs_dir = None, 9002, None, str(tmp_path / "r")

    assert load_config(str(f), Args).port == 9002
    f.write_text('[tinker]\nmax_lora_rnk = 8\n')
    try:
        load_config(str(f))
    except ConfigError as e:
        assert "max_lora_rnk" in str(e)
    else:
        raise AssertionError("an unknown key was accepted")
