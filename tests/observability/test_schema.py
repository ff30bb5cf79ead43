"""The events.jsonl / samples.jsonl schema (observability/schema.py): docs/events.md is what the
code generates; real sync, async and multi-turn tiny runs write records that match it (no
undocumented key, every required key, the right types); samples_per_step bounds samples.jsonl."""

import json
from collections import Counter
from pathlib import Path

import pytest

import traingym
from traingym.envs.multi_turn import MultiTurnEnv, Reply
from traingym.observability import schema
from traingym.observability.events import read_events, read_samples, tool_calls
from traingym.core.types import Observation, StepResult

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def test_docs_events_md_is_generated_from_schema_py():
    assert DOC.read_text() == schema.markdown(), (
        "docs/events.md differs from schema.py: run "
        "`python -m traingym.observability.schema > docs/events.md`")


def test_check_record_names_each_problem():
    ok = {"schema": 1, "sid": "1-0-0", "step": 1, "group": 0, "member": 0, "reward": 0.5,
          "prompt": "p", "completion": "c", "finish_reason": "stop", "turns": 1, "tokens": 3,
          "example": {}}
    assert schema.check_sample(ok) == []
    bad = {**ok, "surprise": 1, "reward": "high"}
    del bad["sid"]
    assert sorted(schema.check_sample(bad)) == sorted([
        "missing required key 'sid'", "undocumented key 'surprise'",
        "'reward' should be float, got 'high'"])
    step = {"schema": 1, "step": 1}
    problems = schema.check_step({**step, "sync_bytes": 3, "util_trainer_busy": None,
                                  "wait_x_s": "no"})
    assert "missing required key 'loss'" in problems
    assert "'wait_x_s' should be float?, got 'no'" in problems
    assert not any("sync_bytes" in p or "util_trainer_busy" in p for p in problems)


def _run(tmp_path, name, **over):
    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "threads": 1, "eval": {"before": False, "after": False}, **over})
    run_dir = tmp_path / name
    return run_dir, cfg


def _check(run_dir: Path, groups_per_step: int, group_size: int = 4) -> list[dict]:
    events = read_events(run_dir)
    assert [e["step"] for e in events] == [1, 2]
    for e in events:
        assert schema.check_step(e) == [], e["step"]
        assert e["schema"] == schema.SCHEMA_VERSION
    samples = read_samples(run_dir)
    for s in samples:
        assert schema.check_sample(s) == [], s["sid"]
    assert len({s["sid"] for s in samples}) == len(samples)  # ids are unique
    per_step = Counter(s["step"] for s in samples)
    assert per_step == {1: groups_per_step * group_size, 2: groups_per_step * group_size}
    return samples


def test_sync_run_records_match_the_schema(tmp_path):
    run_dir, cfg = _run(tmp_path, "sync", observability={"samples_per_step": 2})
    traingym.train(cfg, run_dir=run_dir, progress=False)
    samples = _check(run_dir, groups_per_step=2)
    first = samples[0]
    assert first["sid"] == f"1-{first['group']}-0" and first["member"] == 0
    assert first["tokens"] == 4 and first["prompt"].endswith("The answer is")


def test_async_run_records_match_the_schema(tmp_path):
    run_dir, cfg = _run(tmp_path, "async", mode="async", weights={"transport": "shm"},
                        **{"async": {"max_staleness": 1}})
    traingym.train(cfg, run_dir=run_dir, progress=False)
    _check(run_dir, groups_per_step=4)  # the default: 4 groups per step
    events = read_events(run_dir)
    assert "async_staleness_max" in events[-1] and "prompt_indices" in events[-1]


class Again(MultiTurnEnv):
    async def respond(self, text: str) -> Reply:
        return Reply(messages=[{"role": "user", "content": "Again."}], reward=len(text) / 10)


def test_multi_turn_samples_carry_their_turns(tmp_path):
    rows = [{"prompt": f"What is {a} + 1?"} for a in range(8)]
    run_dir, cfg = _run(tmp_path, "mt", rollout={"max_turns": 2},
                        observability={"samples_per_step": 1})
    traingym.train(cfg, dataset=rows, env=Again, run_dir=run_dir, progress=False)
    samples = _check(run_dir, groups_per_step=1)
    for s in samples:
        roles = [m["role"] for m in s["messages"]]
        assert roles == ["policy", "env", "policy"], roles
        assert "Again." in s["messages"][1]["text"]
        assert s["turns"] == 2


def test_no_samples_file_with_samples_per_step_0(tmp_path):
    run_dir, cfg = _run(tmp_path, "none", steps=1, observability={"samples_per_step": 0})
    traingym.train(cfg, run_dir=run_dir, progress=False)
    assert read_samples(run_dir) == [] and len(read_events(run_dir)) == 1


def test_tool_calls_are_parsed_from_policy_turns_only():
    call = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    turns = [{"role": "policy", "text": "let me " + call},
             {"role": "env", "text": call},  # the environment's text is not a call
             {"role": "policy", "text": "<tool_call>{oops</tool_call>"}]
    got = tool_calls(turns)
    assert got[0] == {"turn": 1, "name": "add", "arguments": {"a": 1}}
    assert got[1]["turn"] == 2 and "not valid JSON" in got[1]["error"] and len(got) == 2
    assert json.dumps(got)  # JSON-safe
    assert tool_calls([{"role": "policy", "text": "no calls"}]) == []


class Judged:
    """A single-turn env whose verdict comes in StepResult.info, as a code env's does."""

    def __init__(self, example, renderer):
        self.renderer = renderer
        self.text = renderer.render(renderer.messages(example))

    async def reset(self):
        return Observation(self.renderer.encode(self.text), self.text)

    async def step(self, completion):
        return StepResult(reward=0.5, done=True,
                          info={"status": "passed", "details": ["1 == 1"], "handle": object()})


def test_env_info_reaches_samples_json_safe_part_only(tmp_path):
    rows = [{"prompt": f"What is {a} + 1?"} for a in range(8)]
    run_dir, cfg = _run(tmp_path, "info", steps=1, observability={"samples_per_step": 1})
    traingym.train(cfg, dataset=rows, env=Judged, run_dir=run_dir, progress=False)
    samples = read_samples(run_dir)
    assert len(samples) == 4 and all(schema.check_sample(s) == [] for s in samples)
    assert all(s["env_info"] == [{"status": "passed", "details": ["1 == 1"]}] for s in samples)
