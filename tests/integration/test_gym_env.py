"""A Gymnasium text environment (traingym/GuessNumber-v0, written against gymnasium's API in
envs/gym_guess.py, made by gymnasium.make) through the adapter (envs/gym_text.py): a short
training run and an evaluation on the tiny preset, named in config as task.env = 'gym:<id>'
(issue 16 acceptance 3, Gymnasium part)."""

import asyncio
import json

import pytest
from prereq import require

import traingym

GYM_ID = "traingym.envs.gym_guess:traingym/GuessNumber-v0"
EPISODES = [{"prompt": f"Game {i}.", "seed": i} for i in range(16)]


@pytest.fixture(autouse=True)
def _gymnasium():
    require("gymnasium", "gymnasium (pip install 'traingym[gym]')")


def _cfg(**task):
    return traingym.build_config("tiny", overrides={
        "steps": 2, "rollout": {"max_turns": 3}, "eval": {"num_prompts": 4},
        "task": {"env": f"gym:{GYM_ID}", "prefill": "", **task}})


def test_gym_text_env_trains_and_evaluates(tmp_path):
    data = tmp_path / "episodes.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in EPISODES[:12]))
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in EPISODES[12:]))
    run = tmp_path / "run"
    result = traingym.train(_cfg(dataset=str(data), eval_dataset=str(held)), run_dir=run,
                            progress=False)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2]
    assert all(1.0 <= e["turns_mean"] <= 3.0 for e in events)
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    first = samples[0]
    # the first user message is the row's prompt, then reset()'s observation
    assert "Game " in first["prompt"] and "I am thinking of a number from 1 to 10" in \
        first["prompt"]
    for s in samples:
        assert s["reward"] in (0.0, 1.0)
        if s["reward"] == 0.0 and s["turns"] > 1:  # a wrong turn got the env's answer
            assert any(h in s["completion"] for h in ("Higher.", "Lower.", "Answer with one"))
    assert "after" in result.eval
    res = traingym.evaluate(run)
    assert res.summary["num_prompts"] == 4
    assert {r["example"]["seed"] for r in res.records} == {12, 13, 14, 15}


def test_adapter_follows_the_env(tmp_path):
    """The adapter's episode, driven by hand: observations become user messages, a right
    guess ends the episode with reward 1.0."""
    from traingym.envs.gym_text import GymMaker
    from traingym.envs.render import PromptRenderer
    from traingym.models.loader import tiny_tokenizer
    from traingym.core.types import Completion

    gym = require("gymnasium", "gymnasium")
    tok = tiny_tokenizer()
    renderer = PromptRenderer(tok, "", "Play.")
    target_env = gym.make(GYM_ID)
    target_env.reset(seed=3)
    target = target_env.unwrapped.target
    env = GymMaker(GYM_ID)({"prompt": "", "seed": 3}, renderer)

    def turn(context, text):
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        return Completion(tuple(context), ids, [0.0] * len(ids), "length", 0)

    async def play():
        obs = await env.reset()
        assert "Play." in obs.text and "number from 1 to 10" in obs.text
        wrong = 1 if target != 1 else 2
        r1 = await env.step(turn(obs.prompt_ids, str(wrong)))
        assert not r1.done and r1.reward == 0.0
        assert ("Higher." if wrong < target else "Lower.") in r1.next_observation.text
        r2 = await env.step(turn(r1.next_observation.prompt_ids, str(target)))
        assert r2.done and r2.reward == 1.0

    asyncio.run(play())


def test_bad_gym_settings_are_named(tmp_path):
    from traingym.envs.gym_text import make_text_env

    with pytest.raises(ValueError, match="not gymnasium.spaces.Text"):
        make_text_env("CartPole-v1")
    with pytest.raises(ValueError, match="gymnasium cannot make it"):
        make_text_env("NoSuchEnv-v0")
    with pytest.raises(traingym.ConfigError, match="needs episodes: set task.dataset"):
        traingym.train(_cfg(), run_dir=tmp_path / "r", progress=False)
