"""Async disaggregated mode on the tiny model, engines in their own processes: end to end at
staleness 1 (tcp) and 2 (shm); no trained group older than the bound; stale groups dropped and
counted, their prompts redone (or skipped); every prompt trained on at most once and none lost;
a killed engine fails the run fast with a clear error, or is restarted with its prompts redone;
an engine that raises or stalls fails the run; bad async configs fail before any work."""

from __future__ import annotations

import time

import pytest

import traingym
from traingym.cluster.local import EngineDied, EngineError, EngineStalled
from traingym.core.errors import ConfigError
from traingym.loop.async_loop import async_train_loop
from traingym.observability.events import read_events
from traingym.loop.build import build_run
from traingym.core.types import ENV_VERSION

# pytest (prepend import mode) puts tests/cluster on sys.path; spawned engines inherit it
from async_envs import AskAgain, KillOnce, SlowFirst, raising_reward  # noqa: E402


def _cfg(steps=6, transport="tcp", **a):
    return traingym.build_config("tiny", overrides={
        "steps": steps, "mode": "async", "threads": 1, "weights": {"transport": transport},
        "async": {"engine_timeout_s": 60.0, **a}, "eval": {"before": False, "after": False}})


def _ledger(events, k):
    """Check staleness and exactly-once from the step records; return (trained, dropped)."""
    trained, dropped = [], []
    for e in events:
        s = e["step"] - 1  # the trainer's version while it trained this step
        assert e["async_staleness_max"] <= k
        assert e["policy_version"] >= s - k and e["policy_version"] <= s
        assert len(e["prompt_indices"]) == 4
        trained += e["prompt_indices"]
        dropped += e["async_dropped_indices"]
    assert len(trained) == len(set(trained)), "a prompt was trained on twice"
    assert sum(e["async_dropped"] for e in events) == events[-1]["async_dropped_total"]
    return trained, dropped


@pytest.mark.parametrize("k,transport,engines", [(1, "tcp", 1), (2, "shm", 2)])
def test_async_run_end_to_end(tmp_path, k, transport, engines):
    result = traingym.train(_cfg(6, transport, max_staleness=k, engines=engines),
                            run_dir=tmp_path / "run", progress=False)
    events = read_events(tmp_path / "run")
    assert [e["step"] for e in events] == [1, 2, 3, 4, 5, 6]
    trained, _ = _ledger(events, k)
    unfinished = result.final_metrics["async_unfinished"]
    # nothing lost: every prompt taken from the stream is trained on or still out
    assert sorted(trained + unfinished) == list(range(len(trained) + len(unfinished)))
    assert any(e["async_staleness_max"] >= 1 for e in events), "never overlapped: vacuous"
    assert all(e["sync_version"] == e["step"] for e in events)
    final = result.final_metrics["async_final_weights"]  # verified against the publisher
    assert [f["engine"] for f in final] == list(range(engines))
    assert all(f["version"] == 6 for f in final)
    assert any(e["groups_kept"] > 0 for e in events)
    weights = [e["is_weight_mean"] for e in events if e["groups_kept"]]
    assert all(0.0 < w <= 2.0 for w in weights)  # tis caps at 2
    assert any(w != 1.0 for w in weights), "stale samples but no importance correction"


def test_multi_turn_episodes_carry_a_version_per_token(tmp_path):
    """Weights change between engine calls, not inside one: an episode that spans an update
    has later turns at a newer version, recorded token by token; env tokens carry none."""
    cfg = _cfg(6, max_staleness=1).model_copy(deep=True)
    cfg.rollout.max_turns = 3
    run, start = build_run(cfg, tmp_path / "run", False, dataset=_slow_rows(24), env=AskAgain,
                           progress=False)
    seen, train_step = [], run.trainer.train_step

    def recording(batch):
        seen.append([s for g in batch.groups for s in g.samples])
        return train_step(batch)

    run.trainer.train_step = recording
    metrics = async_train_loop(run, start)
    run.close()
    events = read_events(tmp_path / "run")
    trained, _ = _ledger(events, 1)
    assert all(e["turns_mean"] > 1 for e in events)
    taken = trained + metrics["async_unfinished"]
    assert sorted(taken) == list(range(len(taken)))
    spanning = 0
    for samples in seen:
        for s in samples:
            policy = [v for v, m in zip(s.versions, s.loss_mask) if m]
            assert all(v == ENV_VERSION for v, m in zip(s.versions, s.loss_mask) if not m)
            assert policy == sorted(policy) and min(policy) >= 0
            spanning += len(set(policy)) > 1
    assert spanning > 0, "no episode spanned a weight update: the test would be vacuous"


def test_inflight_updates_switch_weights_inside_one_completion(tmp_path):
    """With async.inflight_updates, an update lands between decode steps: one single-turn
    completion holds tokens of two versions, recorded token by token, never going back."""
    cfg = _cfg(8, max_staleness=2, inflight_updates=True).model_copy(deep=True)
    cfg.rollout.max_new_tokens, cfg.rollout.ignore_eos = 96, True
    run, start = build_run(cfg, tmp_path / "run", False, progress=False)
    seen, train_step = [], run.trainer.train_step

    def recording(batch):
        seen.append([s for g in batch.groups for s in g.samples])
        return train_step(batch)

    run.trainer.train_step = recording
    metrics = async_train_loop(run, start)
    run.close()
    events = read_events(tmp_path / "run")
    trained, _ = _ledger(events, 2)
    assert all(f["version"] == 8 for f in metrics["async_final_weights"])
    spanning = 0
    for samples in seen:
        for s in samples:
            assert s.turns == 1 and s.versions == sorted(s.versions)
            spanning += len(set(s.versions)) > 1
    assert spanning > 0, "no completion spanned a weight update: the test would be vacuous"


def _slow_rows(n=40):
    return [{"prompt": f"What is {i} + {i % 7}?", "answer": i + i % 7, "slow": i % 4 == 0}
            for i in range(n)]


@pytest.mark.parametrize("recycle", [True, False])
def test_stale_groups_are_dropped_counted_and_redone(tmp_path, recycle):
    rows = _slow_rows()
    result = traingym.train(_cfg(8, max_staleness=1, recycle=recycle), dataset=rows,
                            env=SlowFirst(4, 0.4), run_dir=tmp_path / "run", progress=False)
    events = read_events(tmp_path / "run")
    trained, dropped = _ledger(events, 1)
    assert dropped, "no group was ever too stale: the test would be vacuous"
    unfinished = result.final_metrics["async_unfinished"]
    last = events[-1]
    assert last["async_dropped_total"] == len(dropped)
    if recycle:
        assert last["async_skipped_total"] == 0
        assert set(dropped) <= set(trained) | set(unfinished)  # redone, or still out
        taken = trained + unfinished
    else:
        assert last["async_skipped_total"] == len(dropped)
        assert not set(dropped) & (set(trained) | set(unfinished))  # skipped for good
        taken = trained + unfinished + dropped
    assert sorted(taken) == list(range(len(taken))), "a prompt was lost or taken twice"


def test_killed_engine_fails_the_run_fast(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(EngineDied, match=r"rollout engine 0 .* exited with code -9 holding"):
        traingym.train(_cfg(20), env=KillOnce(str(tmp_path / "marker"), after=30),
                       run_dir=tmp_path / "run", progress=False)
    assert (tmp_path / "marker").exists()
    assert time.monotonic() - t0 < 60


def test_killed_engine_is_restarted_and_its_prompts_redone(tmp_path):
    result = traingym.train(_cfg(8, restarts=1), env=KillOnce(str(tmp_path / "marker"), 30),
                            run_dir=tmp_path / "run", progress=False)
    events = read_events(tmp_path / "run")
    assert (tmp_path / "marker").exists()
    last = events[-1]
    assert last["async_engine_restarts"] == 1 and last["async_redispatched"] > 0
    trained, _ = _ledger(events, 1)
    taken = trained + result.final_metrics["async_unfinished"]
    assert sorted(taken) == list(range(len(taken)))


def test_engine_that_raises_fails_the_run_with_its_traceback(tmp_path):
    with pytest.raises(EngineError, match="reward exploded on purpose"):
        traingym.train(_cfg(3), reward=raising_reward, dataset=_slow_rows(8),
                       run_dir=tmp_path / "run", progress=False)


def test_stalled_engine_fails_within_the_timeout(tmp_path):
    rows = [{**r, "slow": True} for r in _slow_rows(8)]
    t0 = time.monotonic()
    with pytest.raises(EngineStalled, match="delivered nothing"):
        traingym.train(_cfg(3, engine_timeout_s=2.0), dataset=rows, env=SlowFirst(4, 3600.0),
                       run_dir=tmp_path / "run", progress=False)
    assert time.monotonic() - t0 < 40


def test_unpicklable_reward_fails_before_engines_start(tmp_path):
    with pytest.raises(ConfigError, match="must be picklable"):
        traingym.train(_cfg(2), reward=lambda s: 0.0, dataset=_slow_rows(8),
                       run_dir=tmp_path / "run", progress=False)


def test_bad_async_configs_fail_before_work():
    with pytest.raises(ConfigError, match="weights.transport must be"):
        traingym.build_config("tiny", overrides={"mode": "async"})
    with pytest.raises(ConfigError, match="applies only with mode='async'"):
        traingym.build_config("tiny", overrides={"async": {"max_staleness": 2}})
    with pytest.raises(ConfigError, match="'async.is_correction' has moved to "
                       "'algorithm.is_correction'"):
        _cfg(is_correction="mis")
    with pytest.raises(ConfigError, match="algorithm.is_correction"):
        traingym.build_config("tiny", overrides={"algorithm": {"is_correction": "clip"}})
    with pytest.raises(ConfigError, match="unknown key 'async.stale'"):
        _cfg(stale=1)
