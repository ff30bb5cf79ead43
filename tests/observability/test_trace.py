"""The trace (observability/trace.py) and the utilisation figures (observability/utilisation.py):
a tiny sync run and an async run with two engine processes write a trace.json that passes the
Chrome trace-event checks (every span named, timed, placed; every process named; spans nest on
each track), with every phase; utilisation keys in each step record and in results.json;
shards read live, a cut last line skipped; concurrent asyncio tasks on their own lanes; off
writes nothing."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import pytest

import traingym
from traingym.core import trace
from traingym.observability.events import read_events
from traingym.observability.utilisation import sum_s, union_s

STEP_KEYS = {"util_trainer_busy", "util_engines_busy", "wait_trainer_on_rollout_s",
             "wait_engines_on_weights_s", "wait_sandbox_queue_s", "util_env_s"}


def check_trace(doc: dict) -> list[dict]:
    """The JSON checks; returns the complete events."""
    assert set(doc) >= {"traceEvents"}
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    named = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {e["ph"] for e in events} <= {"X", "M"}
    for e in spans:
        assert isinstance(e["name"], str) and e["name"] and isinstance(e["cat"], str)
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["args"], dict)
        assert e["pid"] in named, f"process {e['pid']} has no process_name"
        assert (e["pid"], e["tid"]) in threads, f"track {e['pid']}/{e['tid']} has no name"
    tracks = defaultdict(list)
    for e in spans:
        tracks[(e["pid"], e["tid"])].append(e)
    for track, es in tracks.items():  # on one track spans nest or follow each other
        es.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[int] = []
        for e in es:
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            end = e["ts"] + e["dur"]
            assert not open_ends or end <= open_ends[-1], f"{e['name']} overlaps on {track}"
            open_ends.append(end)
    json.dumps(doc)  # plain JSON throughout
    return spans


def _cfg(**over):
    base = {"steps": 2, "threads": 1, "eval": {"before": False, "after": False}}
    return traingym.build_config("tiny", overrides={**base, **over})


def test_sync_run_writes_a_trace_with_every_phase(tmp_path):
    cfg = _cfg(eval={"before": True, "after": False, "num_prompts": 2},
               checkpoint={"every": 1})
    traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    doc = json.loads((tmp_path / "run" / "trace.json").read_text())
    spans = check_trace(doc)
    names = {e["name"] for e in spans}
    assert names >= {"step", "collect", "generate", "env_reset", "env_step", "train_step",
                     "forward", "backward", "optimizer", "publish", "encode", "transfer",
                     "decode", "verify", "apply", "checkpoint", "eval"}
    assert len({e["pid"] for e in spans}) == 1
    assert [e["args"]["step"] for e in spans if e["name"] == "step"] == [1, 2]
    for step in read_events(tmp_path / "run"):
        assert STEP_KEYS <= set(step)
        assert 0.0 < step["util_trainer_busy"] <= 1.0
        assert 0.0 < step["util_engines_busy"] <= 1.0  # the in-process engine generated
        assert step["wait_trainer_on_rollout_s"] > 0.0
    usage = json.loads((tmp_path / "run" / "results.json").read_text())["utilisation"]
    trainer = usage["processes"]["trainer"]
    assert 0.0 < trainer["busy_frac"] <= 1.0
    assert trainer["busy_s"] + trainer["idle_s"] == pytest.approx(usage["wall_s"])
    assert trainer["waits"]["rollouts_s"] > 0.0
    assert trace.load_trace(tmp_path / "run") == doc  # finished: trace.json itself


def test_async_run_has_spans_from_the_trainer_and_both_engines(tmp_path):
    cfg = _cfg(steps=3, mode="async", weights={"transport": "tcp"},
               **{"async": {"engines": 2, "engine_timeout_s": 60.0}})
    traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    spans = check_trace(json.loads((tmp_path / "run" / "trace.json").read_text()))
    roles = {e["pid"]: e["args"]["name"].split(" ")[0]
             for e in trace.collect(tmp_path / "run")["traceEvents"]
             if e["name"] == "process_name"}
    assert sorted(roles.values()) == ["engine-0", "engine-1", "trainer"]
    by_role = defaultdict(set)
    for e in spans:
        by_role[roles[e["pid"]]].add(e["name"])
    assert by_role["trainer"] >= {"step", "collect", "train_step", "publish", "encode",
                                  "transfer"}
    for engine in ("engine-0", "engine-1"):  # each started and took its first weights
        assert by_role[engine] >= {"start", "wait_weights", "decode", "verify", "apply"}
    assert "generate" in by_role["engine-0"] | by_role["engine-1"]
    events = read_events(tmp_path / "run")
    assert all(STEP_KEYS <= set(e) for e in events)
    usage = json.loads((tmp_path / "run" / "results.json").read_text())["utilisation"]
    assert sum(k.startswith("engine-") for k in usage["processes"]) == 2


def test_trace_off_writes_nothing_and_adds_no_keys(tmp_path):
    traingym.train(_cfg(steps=1, observability={"trace": False}), run_dir=tmp_path / "run",
                   progress=False)
    assert not (tmp_path / "run" / "trace").exists()
    assert not (tmp_path / "run" / "trace.json").exists()
    assert not STEP_KEYS & set(read_events(tmp_path / "run")[0])
    assert trace.load_trace(tmp_path / "run")["traceEvents"] == []
    with trace.span("anything"):  # off: a no-op
        pass


def test_concurrent_tasks_get_their_own_lanes_and_live_shards_read(tmp_path):
    trace.start(tmp_path / "trace", "engine-0")
    try:
        async def episode(i):
            with trace.span("env_step", cat="env", i=i):
                await asyncio.sleep(0.01 * (i % 3))
                with trace.span("sandbox_acquire", cat="wait"):
                    await asyncio.sleep(0.005)

        async def main():
            with trace.span("generate", cat="engine"):
                await asyncio.gather(*(episode(i) for i in range(6)))

        asyncio.run(main())
        live = trace.load_trace(tmp_path)  # no trace.json yet: the shards, merged now
        spans = check_trace(live)
        assert len([e for e in spans if e["name"] == "env_step"]) == 6
        assert len({e["tid"] for e in spans if e["name"] == "env_step"}) == 6  # overlapped
        shard = trace.shards(tmp_path)[0]
        with open(shard, "a") as f:
            f.write('{"name": "cut", "ph": "X", "ts"')  # a crash mid-line
        assert len(check_trace(trace.collect(tmp_path))) == len(spans)
        assert len(check_trace(trace.load_trace(tmp_path, max_events=3))) == 3
    finally:
        trace.stop()
    with open(shard, "a") as f:
        f.write("\nnot json\n{}\n")
    with pytest.raises(ValueError, match="not JSON"):
        trace.collect(tmp_path)


def test_union_and_sum_clip_to_the_window():
    spans = [(0, 2_000_000), (1_000_000, 3_000_000), (5_000_000, 6_000_000)]
    assert union_s(spans, 0, 10_000_000) == 4.0
    assert union_s(spans, 1_500_000, 5_500_000) == 2.0
    assert sum_s(spans, 0, 10_000_000) == 5.0
    assert union_s([], 0, 1) == 0.0


def test_engines_that_cannot_write_the_run_dir_ship_their_spans(tmp_path, monkeypatch):
    """Ray actors on another node get no shard folder: they hold their spans and send them
    with each result; the trainer writes them as the engine's shard. Here a local engine
    process is given no folder, as such an actor is."""
    monkeypatch.setattr(trace, "shard_dir", lambda: None)  # what LocalEngines hands engines
    cfg = _cfg(steps=2, mode="async", weights={"transport": "tcp"},
               **{"async": {"engines": 1, "engine_timeout_s": 60.0}})
    traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    spans = check_trace(json.loads((tmp_path / "run" / "trace.json").read_text()))
    roles = {e["pid"]: e["args"]["name"].split(" ")[0]
             for e in trace.collect(tmp_path / "run")["traceEvents"]
             if e["name"] == "process_name"}
    assert sorted(roles.values()) == ["engine-0", "trainer"]
    engine = {e["name"] for e in spans if roles[e["pid"]] == "engine-0"}
    assert {"start", "wait_weights", "generate", "env_step"} <= engine


def test_held_spans_drain_once(tmp_path):
    trace.start(None, "engine-3")
    try:
        with trace.span("generate", cat="engine"):
            pass
        held = trace.drain()
        assert trace.drain() == []
    finally:
        trace.stop()
    trace.start(tmp_path / "trace", "trainer")
    try:
        trace.write_shipped(held, "engine-3", 4242)
    finally:
        trace.stop()
    doc = check_trace(trace.collect(tmp_path))
    assert [e["name"] for e in doc] == ["generate"]
    assert (tmp_path / "trace" / "engine-3-4242.jsonl").exists()


def test_sandbox_calls_and_their_queue_wait_are_traced(tmp_path):
    """Four code runs through a one-sandbox pool: each has its acquire (queue wait) and exec
    span on its own lane; the waits show in the utilisation keys."""
    from prereq import require_sandbox

    from traingym.observability.utilisation import Spans, window
    from traingym.sandbox import Limits, open_sandbox
    from traingym.sandbox.pool import SandboxPool

    limits = Limits(cpu_s=2, wall_s=10, memory_bytes=256 << 20, processes=32,
                    file_bytes=16 << 20, output_bytes=1 << 20)
    require_sandbox("process", limits)

    async def main():
        pool = SandboxPool(lambda: open_sandbox("process", limits), max_size=1)
        try:
            return await asyncio.gather(*(pool.exec(f"print({i})") for i in range(4)))
        finally:
            await pool.close()

    a = trace.now_us()
    trace.start(tmp_path / "trace", "engine-0")
    try:
        results = asyncio.run(main())
    finally:
        trace.stop()
    assert all(r.ok for r in results)
    spans = check_trace(trace.collect(tmp_path))
    assert sorted(e["name"] for e in spans) == ["sandbox_acquire"] * 4 + ["sandbox_exec"] * 4
    sp = Spans(tmp_path)
    sp.read()
    keys = window(sp, a, trace.now_us())
    assert keys["wait_sandbox_queue_s"] > 0.0  # three of the four waited for the one sandbox
    assert keys["util_engines_busy"] is not None and keys["util_engines_busy"] == 0.0
