"""Multi-turn and tool-use training runs end to end on the tiny model; bad settings fail early."""

import json

import pytest

import traingym
from traingym.config import ConfigError
from traingym.envs.multi_turn import MultiTurnEnv, Reply
from traingym.envs.tools import ToolTask


class Always(MultiTurnEnv):
    """Asks again after every turn; rewards digits, so groups differ and get trained on."""

    async def respond(self, text: str) -> Reply:
        return Reply(messages=[{"role": "user", "content": "Again."}],
                     reward=sum(c.isdigit() for c in text) / max(len(text), 1))


def double(n: int) -> int:
    """Double a number.

    Args:
        n: the number
    """
    return 2 * n


def final_digits(sample) -> float:
    return sum(c.isdigit() for c in sample.final_text) / max(len(sample.final_text), 1)


def _cfg(**over):
    return traingym.build_config("tiny", overrides={
        "steps": 2, "rollout": {"max_turns": 3}, "eval": {"num_prompts": 4}, **over})


ROWS = [{"prompt": f"What is {a} + {b}?", "answer": a + b} for a in range(8) for b in range(8)]


def test_multi_turn_run_trains_on_policy_tokens(tmp_path):
    result = traingym.train(_cfg(), dataset=ROWS, eval_dataset=ROWS[:4], env=Always,
                            run_dir=tmp_path / "r", progress=False)
    events = [json.loads(x) for x in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2]
    assert all(e["turns_mean"] == 3.0 for e in events)  # every episode ran to max_turns
    assert all(e["completion_len_max"] <= 3 * 4 for e in events)  # policy tokens only
    assert any(e["trained_tokens"] > 0 for e in events)
    sample = json.loads((tmp_path / "r" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["completion"].count("Again.") == 2  # env text is in the episode
    assert "after" in result.eval


def test_tool_use_run_from_config_specs(tmp_path):
    task = ToolTask([double], final_digits)
    result = traingym.train(_cfg(task={"prefill": "",
                                       "group_reward": "test_multi_turn_train:shift"}),
                            dataset=ROWS, env=task, run_dir=tmp_path / "r", progress=False)
    assert result.final_metrics["step"] == 2
    assert result.final_metrics["reward_mean"] >= 10.0  # the group hook added 10 to each


def shift(samples):
    return [s.reward + 10.0 + i for i, s in enumerate(samples)]


@pytest.mark.parametrize("over, match", [
    ({"rollout": {"max_turns": 0}}, "rollout.max_turns"),
    ({"rollout": {"max_context_tokens": 1}}, "rollout.max_context_tokens"),
    ({"rollout": {"max_turn": 2}}, "unknown key 'rollout.max_turn'"),
])
def test_bad_multi_turn_config_fails_at_load(over, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**over)


def test_bad_env_spec_fails_before_work(tmp_path):
    with pytest.raises(ConfigError, match="task.env"):
        traingym.train(_cfg(task={"env": "test_multi_turn_train:Nope"}), dataset=ROWS,
                       run_dir=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="not both"):
        traingym.train(_cfg(), dataset=ROWS, env=Always, reward=final_digits,
                       run_dir=tmp_path / "r", progress=False)
