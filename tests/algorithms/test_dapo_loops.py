"""DAPO's dynamic sampling end to end in both loops (they share step.py): with a coarse 0/1
reward and groups of 2, many groups carry no signal; the step asks for more prompts until
rollout.prompts_per_step groups have signal (or max_sample_rounds pass). In async mode the
refill goes through the engines' admission (async_loop.Feed.extra) without stalling, and every
prompt is still trained on at most once."""

import pytest

import traingym
from traingym.observability.events import read_events


def _cfg(mode: str):
    over = {"steps": 4, "threads": 1, "seed": 1,
            "task": {"reward": "coarse_reward:first_is_digit"},
            "rollout": {"group_size": 2}, "algorithm": {"name": "dapo"},
            "eval": {"before": False, "after": False}}
    if mode == "async":
        over.update(mode="async", weights={"transport": "tcp"},
                    **{"async": {"engine_timeout_s": 60.0, "max_staleness": 1}})
    return traingym.build_config("tiny", overrides=over)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dapo_refills_in_both_loops(mode, tmp_path):
    traingym.train(_cfg(mode), run_dir=tmp_path / "run", progress=False)
    events = read_events(tmp_path / "run")
    assert [e["step"] for e in events] == [1, 2, 3, 4]
    refilled = [e for e in events if e["sample_rounds"] > 1]
    assert refilled, "no step needed a refill: the test is vacuous"
    for e in events:
        assert e["groups"] >= 4 and e["groups_kept"] <= 4
        assert e["groups"] == e["groups_kept"] + e["groups_dropped"]
        if e["sample_rounds"] < 4:  # the rounds did not run out: the batch is full
            assert e["groups_kept"] == 4
    if mode == "async":
        trained = [i for e in events for i in e["prompt_indices"]]
        assert len(trained) == len(set(trained)), "a prompt was trained on twice"
        assert sum(len(e["prompt_indices"]) for e in events) == sum(e["groups"] for e in events)
