"""Multi-turn and tool-use training runs end to end on the tiny model; bad settings fail early.

The tool-use run checks that the tool ran (once per episode, with the argument parsed from the
call) and that its result reached the model: its ids follow the first turn in every trained
sample, masked out of the loss and with no policy version, and the next turn was sampled from
the context holding them."""

import json

import pytest

import traingym
from traingym.core.errors import ConfigError
from traingym.envs.multi_turn import MultiTurnEnv, Reply
from traingym.envs.tools import ToolTask


class Always(MultiTurnEnv):
    """Asks again after every turn; rewards digits, so groups differ and get trained on."""

    async def respond(self, text: str) -> Reply:
        return Reply(messages=[{"role": "user", "content": "Again."}],
                     reward=sum(c.isdigit() for c in text) / max(len(text), 1))


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


# The tiny random model never writes a tool call (70 ids of exact JSON), so the pre-fill holds
# one: the first turn is parsed with the pre-fill in front (envs/tools.py), as a real model's
# would be, and the call goes the real way: parse, run the tool, render its result as a tool
# message, append its ids, sample the next turn from that context.
N = 123456789
CALL = f'<tool_call>{{"name": "times_two", "arguments": {{"n": {N}}}}}</tool_call>'
CALLS: list[int] = []


def times_two(n: int) -> int:
    """Double a number, noting the call.

    Args:
        n: the number
    """
    CALLS.append(n)
    return 2 * n


def test_tool_use_run_calls_tools_and_trains_on_their_results(tmp_path, monkeypatch):
    from traingym.models.loader import tiny_tokenizer
    from traingym.rollout.torch_engine import TorchEngine
    from traingym.trainer.torch_trainer import TorchTrainer

    requests, trained = [], []
    engine_generate, train_step = TorchEngine.generate, TorchTrainer.train_step

    async def generate(self, reqs):
        requests.extend(tuple(r.prompt_ids) for r in reqs)
        return await engine_generate(self, reqs)

    def step(self, batch):
        trained.extend(s for g in batch.groups for s in g.samples)
        return train_step(self, batch)

    monkeypatch.setattr(TorchEngine, "generate", generate)
    monkeypatch.setattr(TorchTrainer, "train_step", step)
    CALLS.clear()
    cfg = _cfg(task={"prefill": CALL, "group_reward": "test_multi_turn_train:shift"},
               eval={"before": False, "after": False})
    result = traingym.train(cfg, dataset=ROWS, env=ToolTask([times_two], final_digits),
                            run_dir=tmp_path / "r", progress=False)
    assert result.final_metrics["step"] == 2
    assert result.final_metrics["reward_mean"] >= 10.0  # the group hook added 10 to each
    episodes = cfg.steps * cfg.rollout.prompts_per_step * cfg.rollout.group_size
    assert CALLS == [N] * episodes, "the tool ran once per episode with the parsed argument"

    tok = tiny_tokenizer()
    answer = str(2 * N)
    assert len(trained) == episodes  # the shift hook makes every group's rewards differ
    for s in trained:
        assert s.turns >= 2, "no policy turn after the tool's result"
        assert CALL in tok.decode(s.prompt_ids) and answer not in tok.decode(s.prompt_ids)
        first_env = s.loss_mask.index(0)  # the policy's first turn ends here
        end_env = s.loss_mask.index(1, first_env)  # its second turn starts here
        env_text = tok.decode(s.completion_ids[first_env:end_env])
        assert "tool\n" + answer in env_text, env_text  # the result, masked out of the loss
        assert all(v < 0 for v in s.versions[first_env:end_env])  # no policy version
        # the second turn was sampled from a context holding the result's ids
        assert tuple(s.prompt_ids) + tuple(s.completion_ids[:end_env]) in set(requests)
        policy_ids = [t for t, m in zip(s.completion_ids, s.loss_mask) if m]
        assert answer not in tok.decode(policy_ids)
    logged = [json.loads(x) for x in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert logged and all(answer in x["completion"] for x in logged)


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
