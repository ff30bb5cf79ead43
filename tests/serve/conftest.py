"""Servers for the serve tests: `traingym serve` as a real subprocess (uvicorn) on a free
port, waited for on /v1/models; a checkpoint of the tiny preset trained for 2 steps."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import traingym  # noqa: F401 (build_config)

START_TIMEOUT_S = 240  # start-up imports torch and transformers; the test machines are loaded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: str, *args: str, env: dict | None = None, log: Path):
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "traingym.cli", "serve", model, "--port", str(self.port),
               *args]
        self.proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"traingym serve exited {self.proc.returncode}: "
                                   f"{log.read_text()[-3000:]}")
            try:
                key = (env or {}).get("SERVE_KEY")
                r = httpx.get(self.url + "/v1/models", timeout=5,
                              headers={"Authorization": f"Bearer {key}"} if key else {})
                if r.status_code == 200:
                    self.model = r.json()["data"][0]["id"]
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"traingym serve did not answer in {START_TIMEOUT_S} s: "
                                   f"{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A run directory as `traingym train --preset tiny` leaves it (config.json and a
    committed checkpoint written by checkpoint.save), whose model took two AdamW steps of
    language-model loss on arithmetic text: trained weights, made without the RL loop so the
    serve tests do not depend on the trainer."""
    import json

    import torch

    from traingym.runs import checkpoint
    from traingym.models.loader import load_policy

    run_dir = tmp_path_factory.mktemp("serve") / "tinyrun"
    run_dir.mkdir()
    cfg = traingym.build_config("tiny")
    (run_dir / "config.json").write_text(json.dumps(cfg.model_dump(mode="json")))
    model, tok = load_policy(cfg.model.path, seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.tensor(tok([f"What is {a} + {a + 1}? The answer is {2 * a + 1}."
                              for a in range(4)])["input_ids"])
    for _ in range(2):
        opt.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
    return checkpoint.save(run_dir / "checkpoints", 2, model, opt, {"data_position": 8}, keep=2)


@pytest.fixture(scope="session")
def ckpt_server(tiny_checkpoint, tmp_path_factory):
    # The tiny tokenizer (trained on arithmetic) spends ~670 tokens on the Hermes tool
    # instructions, over the tiny model's 256 positions; it is a RoPE model, so it computes
    # longer positions (garbage in, garbage out, but the same garbage as a reference decode).
    server = Server(str(tiny_checkpoint), "--max-context", "1024",
                    log=tmp_path_factory.mktemp("log") / "serve.log")
    yield server
    server.stop()
