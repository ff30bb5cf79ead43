"""`traingym serve` on another engine of the seam: the tests' RecomputeEngine (no KV cache,
no shared decoding code), chosen with `--set rollout.engine=toy_engine:RecomputeEngine`,
answers greedy chat as the built-in engine does, and refuses top_logprobs (which it does not
return) with a 400 that names it."""

import os
from pathlib import Path

import httpx
import pytest
from conftest import Server


@pytest.fixture(scope="module")
def toy_server(tiny_checkpoint, tmp_path_factory):
    tests = str(Path(__file__).parent.parent)
    s = Server(str(tiny_checkpoint), "--set", "rollout.engine=toy_engine:RecomputeEngine",
               env={"PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])},
               log=tmp_path_factory.mktemp("log") / "toy.log")
    yield s
    assert s.stop() == 0


def test_greedy_equals_builtin_engine(toy_server, ckpt_server):
    body = {"model": ckpt_server.model, "temperature": 0, "max_tokens": 10,
            "messages": [{"role": "user", "content": "What is 4 + 4?"}]}
    a = httpx.post(toy_server.url + "/v1/chat/completions", json=body, timeout=120).json()
    b = httpx.post(ckpt_server.url + "/v1/chat/completions", json=body, timeout=120).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"] == b["usage"]
    assert httpx.get(toy_server.url + "/health").json()["engine"]["ok"]


def test_top_logprobs_refused_by_name(toy_server):
    r = httpx.post(toy_server.url + "/v1/chat/completions", timeout=120, json={
        "model": toy_server.model, "max_tokens": 3, "logprobs": True, "top_logprobs": 2,
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "RecomputeEngine" in r.json()["error"]["message"]
