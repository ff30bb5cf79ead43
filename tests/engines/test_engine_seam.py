"""The engine seam: a second engine (tests/toy_engine.py) added with one class and one registry
line trains the tiny model in sync mode and in async mode (built inside a spawned engine
process from the class the trainer's registry resolved), its weights hash-equal to the
trainer's after every step; bad engine names and abilities a run needs but its engine lacks
fail when the config is built or before the run directory exists."""

from __future__ import annotations

import os

import pytest
from toy_engine import RecomputeEngine  # noqa: E402  (tests/ is on sys.path)

import traingym
from traingym.core.errors import ConfigError
from traingym.loop.build import build_run
from traingym.loop.sync import train_loop
from traingym.observability.events import read_events
from traingym.rollout import registry
from traingym.rollout.base import EngineAbilities
from traingym.weights.colocated import wire_state
from traingym.weights.hashing import state_hash


def test_sync_run_with_a_toy_engine_registered_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.ENGINES, "toy", "toy_engine:RecomputeEngine")  # the one line
    cfg = traingym.build_config("tiny", overrides={
        "steps": 3, "rollout": {"engine": "toy"}, "eval": {"before": False, "after": False}})
    run, start = build_run(cfg, tmp_path / "run", False, progress=False)
    engine = run.engine
    assert isinstance(engine, RecomputeEngine)
    seen = []  # (engine version, engine hash == trainer hash) at every publish
    publish = run.weights.publish

    def checked_publish(state, version, **kw):
        stats = publish(state, version, **kw)
        seen.append((engine.version, engine.state_hash() ==
                     state_hash(wire_state(state, run.weights.dtype))))
        return stats

    run.weights.publish = checked_publish
    try:
        train_loop(run, start)
    finally:
        run.close()
        run.lock.release()
    assert seen == [(1, True), (2, True), (3, True)]
    assert engine.calls >= 3
    events = read_events(tmp_path / "run")
    assert [e["step"] for e in events] == [1, 2, 3]
    assert all(e["sync_version"] == e["step"] for e in events)
    assert events[-1]["loss"] != 0.0 or events[-1]["groups_kept"] == 0


def test_async_run_builds_the_toy_engine_in_its_process(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.ENGINES, "toy", "toy_engine:RecomputeEngine")
    cfg = traingym.build_config("tiny", overrides={
        "steps": 3, "mode": "async", "threads": 1, "weights": {"transport": "shm"},
        "rollout": {"engine": "toy"}, "async": {"engine_timeout_s": 60.0},
        "eval": {"before": False, "after": False}})
    log = tmp_path / "built.txt"
    monkeypatch.setenv("TOY_ENGINE_LOG", str(log))  # spawned engine processes inherit it
    result = traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    pids = [int(x) for x in log.read_text().split()]
    assert os.getpid() in pids  # the trainer's own engine (evaluation) ...
    assert len(set(pids) - {os.getpid()}) == 1  # ... and the engine process's
    events = read_events(tmp_path / "run")
    assert [e["step"] for e in events] == [1, 2, 3]
    final = result.final_metrics["async_final_weights"]  # the engine's state_hash, checked
    assert [(f["engine"], f["version"]) for f in final] == [(0, 3)]


class ReadOnly(RecomputeEngine):
    abilities = EngineAbilities(takes_weights=False, crosses_processes=True)


class SyncOnly(RecomputeEngine):
    abilities = EngineAbilities(takes_weights=True, crosses_processes=False)


def test_engine_names_options_and_abilities_are_checked_before_any_work(tmp_path):
    def build(**rollout):
        return traingym.build_config("tiny", overrides={"rollout": rollout})

    with pytest.raises(ConfigError, match=r"unknown rollout.engine 'torhc'.*did you mean 'torch'"):
        build(engine="torhc")
    with pytest.raises(ConfigError, match="cannot load no_such_module:X"):
        build(engine="no_such_module:X")
    with pytest.raises(ConfigError, match="is not an engine class"):
        build(engine="toy_engine:torch")  # a module attribute that is no engine
    with pytest.raises(ConfigError, match=r"engine_options for 'torch': 'fusd': Extra inputs"
                                          r".*did you mean 'fused'\?"):
        build(engine_options={"fusd": False})
    assert build(engine="toy_engine:RecomputeEngine").rollout.engine == \
        "toy_engine:RecomputeEngine"

    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="read-only"):
        traingym.train(build(engine="test_engine_seam:ReadOnly"), run_dir=run_dir)
    async_cfg = traingym.build_config("tiny", overrides={
        "mode": "async", "weights": {"transport": "shm"},
        "rollout": {"engine": "test_engine_seam:SyncOnly"}})
    with pytest.raises(ConfigError, match="builds engines in their own processes"):
        traingym.train(async_cfg, run_dir=run_dir)
    inflight = traingym.build_config("tiny", overrides={
        "mode": "async", "weights": {"transport": "shm"}, "async": {"inflight_updates": True},
        "rollout": {"engine": "toy_engine:RecomputeEngine"}})
    with pytest.raises(ConfigError, match="inflight_updates needs an engine"):
        traingym.train(inflight, run_dir=run_dir)
    assert not run_dir.exists()  # refused before the run directory was made
