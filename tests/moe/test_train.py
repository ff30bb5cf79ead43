"""A tiny Qwen3-MoE (tests/moe_tiny.py, saved as a Hugging Face folder) trains end to end
through `traingym train --set model.path=...` (and `traingym.train`): sync mode, the built-in
engine (its fused MoE decode records routes), 3 steps, and every step's event carries the
route mismatch; with algorithm.routing_replay it is 0, also with engine processes (async), two
ranks, multi-turn episodes and LoRA. A config asking for replay from an engine that reports no
routes is refused before any work."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from moe_tiny import save_tiny_moe  # tests/ is on sys.path (tests/conftest.py)

import traingym
from traingym.core.errors import ConfigError
from traingym.envs.multi_turn import MultiTurnEnv, Reply
from traingym.observability.events import read_events
from traingym.observability.schema import check_step


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return save_tiny_moe(tmp_path_factory.mktemp("moe"), "qwen3_moe")


def _train(moe_path, tmp_path, replay: bool, steps: int = 3, train_kw=None, **over):
    cfg = traingym.build_config("tiny", overrides={
        "steps": steps, "threads": 1, "model": {"path": moe_path},
        "eval": {"before": False, "after": False},
        "algorithm": {"routing_replay": replay}, **over})
    traingym.train(cfg, run_dir=tmp_path / "run", progress=False, **(train_kw or {}))
    return read_events(tmp_path / "run")


class Again(MultiTurnEnv):
    """Asks again after every turn; rewards digits, so groups differ and get trained on."""

    async def respond(self, text: str) -> Reply:
        return Reply(messages=[{"role": "user", "content": "Again."}],
                     reward=sum(c.isdigit() for c in text) / max(len(text), 1))


ROWS = [{"prompt": f"What is {a} + {b}?", "answer": a + b} for a in range(8) for b in range(8)]


def test_cli_sync_run_with_routing_replay_trains_and_reports_route_mismatch(moe_path,
                                                                            tmp_path):
    src = str(Path(traingym.__file__).resolve().parents[1])  # this checkout's traingym
    p = subprocess.run([sys.executable, "-m", "traingym.cli", "train", "--preset", "tiny",
                        "--set", f"model.path={moe_path}", "--set",
                        "algorithm.routing_replay=true", "--set", "steps=3", "--set",
                        "eval.before=false", "--set", "eval.after=false", "--run-dir",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": src})
    assert p.returncode == 0, p.stderr
    events = read_events(tmp_path / "run")
    assert [e["step"] for e in events] == [1, 2, 3]
    trained = [e for e in events if e["trained_tokens"]]
    assert trained, "no step trained"
    for e in trained:
        assert check_step(e) == [], check_step(e)
        assert e["moe_route_mismatch"] == 0.0, e
        assert 0.0 <= e["moe_router_mismatch"] <= 1.0
        assert e["mismatch_abs_logp"] < 1e-4 and math.isfinite(e["grad_norm"])


def test_without_replay_the_mismatch_is_measured(moe_path, tmp_path):
    events = _train(moe_path, tmp_path, replay=False)
    trained = [e for e in events if e["trained_tokens"]]
    assert trained and all(e["moe_route_mismatch"] == e["moe_router_mismatch"]
                           for e in trained)


@pytest.mark.parametrize("over", [
    {"mode": "async", "weights": {"transport": "tcp"}, "async": {"engine_timeout_s": 60.0}},
    {"trainer": {"data_parallel": 2}}], ids=["async", "data_parallel"])
def test_replay_in_async_mode_and_with_data_parallel_ranks(moe_path, tmp_path, over):
    """Routes cross from engine processes (async) and to a second rank (DDP); the counts of
    both ranks add up to one fraction."""
    events = _train(moe_path, tmp_path, replay=True, steps=2, **over)
    trained = [e for e in events if e["trained_tokens"]]
    assert trained
    for e in trained:
        assert check_step(e) == [], check_step(e)
        assert e["moe_route_mismatch"] == 0.0 and 0.0 <= e["moe_router_mismatch"] <= 1.0


@pytest.mark.parametrize("kind", ["multi_turn", "lora"])
def test_replay_in_multi_turn_episodes_and_with_lora(moe_path, tmp_path, kind):
    """Multi-turn: the last turn's routes cover the whole context (models/moe.py), environment
    tokens included; LoRA: the routers are found through the adapter wrapper."""
    if kind == "multi_turn":
        events = _train(moe_path, tmp_path, True, 2, {"env": Again, "dataset": ROWS},
                        rollout={"max_turns": 3})
        assert all(e["turns_mean"] == 3.0 for e in events)
    else:
        events = _train(moe_path, tmp_path, True, 2, lora={"rank": 4})
    trained = [e for e in events if e["trained_tokens"]]
    assert trained
    for e in trained:
        assert e["moe_route_mismatch"] == 0.0 and e["mismatch_abs_logp"] < 1e-4, e


def test_replay_with_an_engine_that_reports_no_routes_is_refused(moe_path):
    with pytest.raises(ConfigError, match="does not report routes.*use 'torch'"):
        traingym.build_config("tiny", overrides={
            "model": {"path": moe_path}, "rollout": {"engine": "vllm"},
            "algorithm": {"routing_replay": True}})
