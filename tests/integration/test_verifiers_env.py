"""verifiers environments through the adapter (envs/verifiers_env.py, issue 16 acceptance 3,
verifiers part): small single-turn, multi-turn and tool environments written against verifiers'
real classic API (tests/vf_tiny.py, loaded by `vf.load_environment` like an installed package)
train 2 steps on the tiny preset and evaluate; episodes driven by hand check that verifiers'
own env_response, stop conditions, tools and rubric decide what happens."""

from __future__ import annotations

import asyncio
import json

import pytest
from prereq import require

import traingym


@pytest.fixture(autouse=True)
def _verifiers():
    require("verifiers", "verifiers (pip install 'traingym[verifiers]')")


def _cfg(kind: str, **top):
    return traingym.build_config("tiny", overrides={
        "steps": 2, "eval": {"num_prompts": 4},
        "task": {"env": "verifiers:vf-tiny", "env_args": {"kind": kind}, "prefill": ""}, **top})


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_single_turn_env_trains_and_evaluates(tmp_path):
    run = tmp_path / "run"
    result = traingym.train(_cfg("single"), run_dir=run, progress=False)
    assert [e["step"] for e in _lines(run / "events.jsonl")] == [1, 2]
    samples = _lines(run / "samples.jsonl")
    assert len(samples) == 2 * 4 * 4
    for s in samples:
        (info,) = [i["verifiers"] for i in s["env_info"]]
        parts = info["rewards"]
        assert set(parts) == {"exact", "digits"}  # the rubric's weighted functions
        assert s["reward"] == pytest.approx(1.0 * parts["exact"] + 0.5 * parts["digits"])
        assert info["stop"] == "max_turns_reached" and info["turns"] == 1
        # the verifiers row: its system prompt and question, rendered with the chat template
        assert "Answer with the number only." in s["prompt"] and "What is" in s["prompt"]
        text = s["completion"]  # what verifiers got as the assistant message
        expect = sum(c.isdigit() for c in text) / len(text) if text else 0.0
        assert parts["digits"] == pytest.approx(expect)
    assert "after" in result.eval
    res = traingym.evaluate(run)
    # the env's eval_dataset (its last 4 rows), not training rows
    assert sorted(r["example"]["answer"] for r in res.records if r["mode"] == "greedy") == \
        sorted(["7", "8", "9", "10"])
    assert res.summary["num_prompts"] == 4


def test_multi_turn_env_trains(tmp_path):
    run = tmp_path / "run"
    traingym.train(_cfg("multi", eval={"num_prompts": 4, "before": False}), run_dir=run,
                   progress=False)
    samples = _lines(run / "samples.jsonl")
    assert samples
    for s in samples:
        (info,) = [i["verifiers"] for i in s["env_info"]]
        assert info["stop"] in ("has_final_env_response", "max_turns_reached")
        assert 1 <= s["turns"] <= 3
        assert s["turns"] == info["turns"]
        assert s["reward"] == (1.0 if info["stop"] == "has_final_env_response" else 0.0)
        if s["turns"] > 1:  # verifiers' env_response came back as a user turn
            assert any(w in s["completion"] for w in ("Higher.", "Lower.",
                                                       "Answer with one number."))


def _play(kind: str, turns: list[str], row: int = 0, env=None):
    """Drive one episode by hand with scripted policy turns; the step results."""
    from traingym.envs.render import PromptRenderer
    from traingym.envs.verifiers_env import VerifiersMaker, env_rows
    from traingym.models.loader import tiny_tokenizer
    from traingym.core.types import Completion

    tok = tiny_tokenizer()
    maker = VerifiersMaker(env=env) if env is not None else \
        VerifiersMaker("vf-tiny", {"kind": kind})
    example = env_rows(maker.environment(), 1)[0][row]
    episode = maker(example, PromptRenderer(tok, ""))
    end = tok.convert_tokens_to_ids("<|im_end|>")

    async def go():
        obs = await episode.reset()
        out, ctx = [obs], obs.prompt_ids
        for text in turns:
            ids = tok.encode(text, add_special_tokens=False) + [end]
            r = await episode.step(Completion(tuple(ctx), ids, [0.0] * len(ids), "stop", 0))
            out.append(r)
            if r.done:
                break
            ctx = r.next_observation.prompt_ids
        return out

    return example, asyncio.run(go())


def test_multi_turn_episode_by_hand():
    example, (obs, r1, r2) = _play("multi", ["99", "0"])
    target = int(example["answer"])
    assert 1 <= target <= 10 and "Guess my number" in obs.text
    assert not r1.done and "Lower." in r1.next_observation.text and r1.reward == 0.0
    assert not r2.done and "Higher." in r2.next_observation.text
    example, results = _play("multi", ["99", str(target)])
    assert results[-1].done and results[-1].reward == 1.0
    assert results[-1].info["verifiers"] == {"rewards": {"solved": 1.0}, "reward": 1.0,
                                             "stop": "has_final_env_response",
                                             "turns": 2}


def test_tool_env_episode_by_hand():
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>'
    example, (obs, r1, r2) = _play("tool", [call, "The sum is 42."])
    assert '"name": "add"' in obs.text  # the tool's schema reached the prompt
    assert not r1.done and "<|im_start|>tool\n42<|im_end|>" in r1.next_observation.text
    assert r2.done and r2.info["verifiers"]["stop"] == "no_tools_called"
    want = 1.0 if example["answer"] in "The sum is 42." else 0.0
    assert r2.reward == want and r2.info["verifiers"]["rewards"] == {"sum_in_answer": want}
    # a turn without a tool call ends the episode at once
    _, (obs, r) = _play("tool", [f"It is {example['answer']}."])
    assert r.done and r.reward == 1.0


def test_a_raising_reward_function_stops_naming_it():
    import verifiers as vf
    from datasets import Dataset

    def broken(completion) -> float:
        raise KeyError("boom")

    env = vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "Hi?", "answer": "1"}] * 2),
                           rubric=vf.Rubric(funcs=[broken], weights=[1.0]))
    with pytest.raises(ValueError, match="reward function broken raised KeyError"):
        _play("single", ["1"], env=env)


def test_what_is_not_covered_is_refused(tmp_path):
    import verifiers as vf
    from datasets import Dataset

    from traingym.envs.verifiers_env import VerifiersMaker

    def ranked(completions) -> list[float]:
        return [0.0] * len(completions)

    env = vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "Hi?", "answer": "1"}]),
                           rubric=vf.Rubric(funcs=[ranked], weights=[1.0]))
    with pytest.raises(ValueError, match="scores a group"):
        VerifiersMaker(env=env)
    with pytest.raises(ValueError, match="Could not import 'no-such-env'"):
        traingym.train(traingym.build_config("tiny", overrides={
            "task": {"env": "verifiers:no-such-env"}}), run_dir=tmp_path / "r", progress=False)
    with pytest.raises(traingym.ConfigError, match="env_args apply only"):
        traingym.build_config("tiny", overrides={"task": {"env_args": {"kind": "x"}}})


def test_an_environment_object_trains_from_python(tmp_path):
    """`train(cfg, env=VerifiersMaker(env=...))`: the object's own rows, no task.env."""
    import vf_tiny

    from traingym.envs.verifiers_env import VerifiersMaker

    cfg = traingym.build_config("tiny", overrides={
        "steps": 1, "eval": {"num_prompts": 4, "before": False, "after": False},
        "task": {"prefill": ""}})
    run = tmp_path / "run"
    traingym.train(cfg, env=VerifiersMaker(env=vf_tiny.load_environment("single")),
                   run_dir=run, progress=False)
    samples = _lines(run / "samples.jsonl")
    assert samples and all("Answer with the number only." in s["prompt"] for s in samples)
    assert all(set(s["env_info"][0]["verifiers"]["rewards"]) == {"exact", "digits"}
               for s in samples)


def test_the_maker_pickles_by_id():
    """mode='async' sends the maker to engine processes, which load the env by id."""
    import pickle

    from traingym.envs.verifiers_env import VerifiersMaker

    maker = pickle.loads(pickle.dumps(VerifiersMaker("vf-tiny", {"kind": "tool"})))
    assert maker.env is None and maker.env_args == {"kind": "tool"}
    assert type(maker.environment()).__name__ == "ToolEnv"


def test_an_episode_cut_early_cancels_verifiers_task():
    """The runner stops an episode (max_context_tokens) while verifiers waits for the policy's
    next turn: discarding the episode cancels verifiers' task instead of leaving it pending."""
    import gc

    from traingym.envs.render import PromptRenderer
    from traingym.envs.verifiers_env import VerifiersMaker, env_rows
    from traingym.models.loader import tiny_tokenizer
    from traingym.core.types import Completion

    tok = tiny_tokenizer()
    maker = VerifiersMaker("vf-tiny", {"kind": "multi"})
    example = env_rows(maker.environment(), 1)[0][0]
    end = tok.convert_tokens_to_ids("<|im_end|>")

    async def go():
        episode = maker(example, PromptRenderer(tok, ""))
        obs = await episode.reset()
        ids = tok.encode("99", add_special_tokens=False) + [end]
        r = await episode.step(Completion(tuple(obs.prompt_ids), ids, [0.0] * len(ids), "stop",
                                          0))
        assert not r.done
        task = episode._task
        del episode, r
        gc.collect()
        for _ in range(5):
            await asyncio.sleep(0)
        assert task.cancelled()  # here: asyncio.run would cancel it at the end anyway

    asyncio.run(go())


def test_a_turn_limit_above_traingyms_is_refused(tmp_path):
    """vf-tiny's multi env has max_turns=3: rollout.max_turns=2 would cut it before scoring."""
    import verifiers as vf
    import vf_tiny
    from datasets import Dataset

    from traingym.envs.verifiers_env import VerifiersMaker

    with pytest.raises(traingym.ConfigError, match=r"max_turns=3 but rollout.max_turns=2"):
        traingym.train(_cfg("multi", rollout={"max_turns": 2}), run_dir=tmp_path / "r",
                       progress=False)
    endless = vf_tiny.GuessEnv(dataset=Dataset.from_list([{"question": "Hi?", "answer": "1"}]),
                               max_turns=-1, rubric=vf.Rubric(funcs=[vf_tiny.solved],
                                                              weights=[1.0]))
    assert endless.max_turns == -1
    with pytest.raises(traingym.ConfigError, match=r"max_turns=-1 \(unlimited\)"):
        traingym.train(traingym.build_config("tiny", overrides={"steps": 1}),
                       env=VerifiersMaker(env=endless), run_dir=tmp_path / "r2", progress=False)


def test_reward_functions_of_one_name_are_both_recorded():
    import verifiers as vf
    from datasets import Dataset

    env = vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "Hi?", "answer": "1"}] * 2),
                           rubric=vf.Rubric(funcs=[lambda completion: 1.0,
                                                   lambda completion: 0.25],
                                            weights=[1.0, 2.0]))
    _, (obs, r) = _play("single", ["1"], env=env)
    assert r.info["verifiers"]["rewards"] == {"<lambda>": 1.0, "<lambda>_2": 0.25}
    assert r.reward == 1.5
