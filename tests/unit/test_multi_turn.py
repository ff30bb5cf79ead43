"""Multi-turn episodes: env tokens appended as ids, masked out of the loss token by token; the
runner's limits; the trainer learns from policy tokens only; the group hook; picklable factories."""

import copy
import pickle

import pytest
import torch

from traingym.trainer.config import TrainerConfig
from traingym.envs.group import score_group
from traingym.envs.multi_turn import BoundFactory, MultiTurnEnv, Reply
from traingym.envs.render import PromptRenderer
from traingym.envs.single_turn import RewardError, SingleTurnFactory
from traingym.envs.tasks import exact_answer
from traingym.envs.transcript import ContextError
from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.envs.runner import EpisodeLimits, RolloutRunner
from traingym.trainer import torch_trainer
from traingym.trainer.torch_trainer import TorchTrainer
from traingym.core.types import Batch, Completion, Group, Observation, SamplingParams, StepResult


class IdsTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


class ScriptedEngine:
    """Call c, request r, sample k -> tokens [1000c + 100r + k, 1000c + 100r + k + 50]."""

    version = 3

    def __init__(self):
        self.calls = []

    async def generate(self, requests):
        self.calls.append(requests)
        c = len(self.calls)
        return [[Completion(r.prompt_ids, [1000 * c + 100 * i + k, 1000 * c + 100 * i + k + 50]
                            [: r.params.max_new_tokens], [-0.5] * min(2, r.params.max_new_tokens),
                            "length", self.version) for k in range(r.n)]
                for i, r in enumerate(requests)]


class ScriptedEnv:
    """Answers (7, 8, 9) after each policy turn; done after `turns` turns (reward 0.25 a step,
    1.0 at the end). `bad` rewrites the context instead of extending it."""

    def __init__(self, example, turns=2, bad=False):
        self.turns, self.bad, self.n = turns, bad, 0

    async def reset(self):
        return Observation((1, 2, 3), "p")

    async def step(self, c):
        self.n += 1
        if self.n >= self.turns:
            return StepResult(1.0, done=True)
        context = (9,) + tuple(c.prompt_ids)[1:] if self.bad else tuple(c.prompt_ids)
        return StepResult(0.25, done=False,
                          next_observation=Observation(context + tuple(c.token_ids) + (7, 8, 9)))


def _collect(env_factory, limits, group_size=2, max_new_tokens=2):
    engine = ScriptedEngine()
    runner = RolloutRunner(engine, env_factory, SamplingParams(max_new_tokens=max_new_tokens),
                           group_size, tokenizer=IdsTokenizer(), limits=limits)
    return runner.collect([(0, {"prompt": "x"})], seed=1), engine


def test_env_ids_are_appended_verbatim_and_masked_token_by_token():
    (group,), engine = _collect(lambda ex: ScriptedEnv(ex, turns=3), EpisodeLimits(max_turns=5))
    a, b = group.samples
    assert a.completion_ids == [1000, 1050, 7, 8, 9, 2000, 2050, 7, 8, 9, 3000, 3050]
    assert a.loss_mask == [1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    assert b.completion_ids == [1001, 1051, 7, 8, 9, 2100, 2150, 7, 8, 9, 3100, 3150]
    assert b.loss_mask == a.loss_mask
    assert a.completion_logprobs == [-0.5, -0.5, 0, 0, 0, -0.5, -0.5, 0, 0, 0, -0.5, -0.5]
    assert a.versions == [3, 3, -1, -1, -1, 3, 3, -1, -1, -1, 3, 3]
    assert (a.reward, a.turns, a.finish_reason, a.prompt_ids) == (1.5, 3, "length", (1, 2, 3))
    # the first turn is one request of n=2 (shared prefill); later turns continue each context
    assert [(r.prompt_ids, r.n) for r in engine.calls[0]] == [((1, 2, 3), 2)]
    assert [r.prompt_ids for r in engine.calls[1]] == [(1, 2, 3, 1000, 1050, 7, 8, 9),
                                                       (1, 2, 3, 1001, 1051, 7, 8, 9)]
    assert engine.calls[2][0].prompt_ids == (1, 2, 3) + tuple(a.completion_ids[:10])
    assert a.final_text == "3000 3050"


def test_observation_that_does_not_extend_the_context_is_an_error():
    with pytest.raises(ContextError, match="example 0, sample 0, turn 1: .* differs at token 0"):
        _collect(lambda ex: ScriptedEnv(ex, turns=3, bad=True), EpisodeLimits(max_turns=5))


def test_max_turns_and_max_context_end_episodes_cleanly():
    (group,), _ = _collect(lambda ex: ScriptedEnv(ex, turns=9), EpisodeLimits(max_turns=2))
    s = group.samples[0]
    assert (s.turns, s.finish_reason, s.reward) == (2, "max_turns", 0.5)
    assert s.loss_mask == [1, 1, 0, 0, 0, 1, 1]  # ends with policy tokens, no trailing env ids
    # context 3 + 2 = 5; the reply would make it 8 >= 8: the episode ends before it
    (group,), _ = _collect(lambda ex: ScriptedEnv(ex, turns=9), EpisodeLimits(9, 8))
    s = group.samples[0]
    assert (s.turns, s.finish_reason, s.completion_ids) == (1, "max_context", [1000, 1050])
    # room left in the context cuts max_new_tokens: 3 + 2 + 3 = 8 of 9 leaves 1 token
    (group,), engine = _collect(lambda ex: ScriptedEnv(ex, turns=9), EpisodeLimits(9, 9))
    assert engine.calls[1][0].params.max_new_tokens == 1
    assert group.samples[0].completion_ids == [1000, 1050, 7, 8, 9, 2000]
    with pytest.raises(ValueError, match="leaves no room"):
        _collect(lambda ex: ScriptedEnv(ex), EpisodeLimits(9, 3))


def _naive_logp(model, prompt, completion):
    ids = torch.tensor([list(prompt) + list(completion)])
    logits = model(input_ids=ids).logits[0].log_softmax(-1)
    lp = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    return lp.gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_trainer_learns_from_policy_tokens_only_and_sees_env_ids_verbatim(monkeypatch):
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=2).double()
    before = copy.deepcopy(model)
    env_ids = [40, 41, 42]
    prompt = (5, 6, 7)
    comps = [[20, 21] + env_ids + [22], [23] + env_ids + [24, 25]]
    masks = [[1, 1, 0, 0, 0, 1], [1, 0, 0, 0, 1, 1]]
    from traingym.core.types import Sample
    samples = [Sample(prompt, c, [0.0] * len(c), [0] * len(c), {}, loss_mask=m, reward=r)
               for c, m, r in zip(comps, masks, (1.0, 0.0))]
    seen = []
    real = torch_trainer.completion_logprobs

    def spy(model_, *args):
        seen.append(args)
        return real(model_, *args)

    monkeypatch.setattr(torch_trainer, "completion_logprobs", spy)
    cfg = TrainerConfig(lr=1e-3, grad_clip=1e9, bf16_autocast=False)
    trainer = TorchTrainer(model, cfg, temperature=1.0, pad_token_id=tok.pad_token_id)
    grads, step = [], trainer.clip_and_step  # the gradients as the optimizer gets them

    def recorded():
        grads.extend(p.grad.clone() for p in model.parameters())
        return step()

    trainer.clip_and_step = recorded
    metrics = trainer.train_step(Batch([Group(samples, 0)], [[0.5, -0.5]]))
    assert metrics["trained_tokens"] == 6  # policy tokens only
    prompts, completions, _, _, loss_masks = seen[0]
    assert prompts == [prompt] and completions == [comps] and loss_masks == [masks]
    # expected gradient: -sum over policy tokens of adv * grad logp, over 6 tokens
    expected = sum(-adv * (_naive_logp(before, prompt, c) * torch.tensor(m, dtype=torch.double)).sum()
                   for c, m, adv in zip(comps, masks, (0.5, -0.5))) / 6
    expected.backward()
    for p_ref, g in zip(before.parameters(), grads, strict=True):
        assert torch.allclose(p_ref.grad, g, rtol=1e-5, atol=1e-7)


class Retry(MultiTurnEnv):
    async def respond(self, text):
        if "5" in text:
            return Reply(reward=1.0, done=True)
        return Reply(messages=[{"role": "user", "content": "Try again."}], reward=0.1)


def test_multi_turn_env_appends_the_rendered_reply_as_ids():
    tok = tiny_tokenizer()
    renderer = PromptRenderer(tok)
    eos = tok.eos_token_id
    for finish, policy in (("stop", tok.encode("4") + [eos]), ("length", tok.encode("4"))):
        env = Retry({"prompt": "What is 2 + 3?"}, renderer)
        obs = env_run(env.reset())
        assert obs.prompt_ids == renderer.ids({"prompt": "What is 2 + 3?"})
        result = env_run(env.step(Completion(obs.prompt_ids, policy, [0.0] * len(policy),
                                             finish, 0)))
        reply = ("" if finish == "stop" else "<|im_end|>") + \
            "\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n"
        assert result.next_observation.text == reply
        assert result.next_observation.prompt_ids == \
            obs.prompt_ids + tuple(policy) + tuple(tok(reply, add_special_tokens=False)["input_ids"])
        assert not result.done and result.reward == 0.1
    # what the policy wrote is kept id for id, even a non-canonical tokenization of "4"
    odd = [tok.convert_tokens_to_ids("4"), eos]
    env = Retry({"prompt": "q"}, renderer)
    obs = env_run(env.reset())
    result = env_run(env.step(Completion(obs.prompt_ids, odd, [0.0, 0.0], "stop", 0)))
    assert result.next_observation.prompt_ids[: len(obs.prompt_ids) + 2] == obs.prompt_ids + tuple(odd)


def env_run(coro):
    import asyncio

    return asyncio.run(coro)


def test_group_hook_sets_rewards_and_fails_loudly():
    (group,), _ = _collect(lambda ex: ScriptedEnv(ex, turns=1), EpisodeLimits())
    values = score_group(lambda ss: [s.reward * 2 + i for i, s in enumerate(ss)], group.samples)
    assert values == [2.0, 3.0]
    engine = ScriptedEngine()
    runner = RolloutRunner(engine, lambda ex: ScriptedEnv(ex, turns=1), SamplingParams(), 2,
                           tokenizer=IdsTokenizer(), group_reward=lambda ss: [0.0, 7.0])
    assert [s.reward for s in runner.collect([(0, {})], 1)[0].samples] == [0.0, 7.0]
    with pytest.raises(RewardError, match="list of 2 finite floats"):
        score_group(lambda ss: [1.0], group.samples)
    with pytest.raises(RewardError, match="raised ZeroDivisionError"):
        score_group(lambda ss: [1 / 0], group.samples)


def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: one number
        b: another
    """
    return a + b


def test_factories_pickle_and_build_working_envs():
    from traingym.envs.tools import ToolTask

    renderer = PromptRenderer(tiny_tokenizer())
    for factory in (SingleTurnFactory(exact_answer, renderer), BoundFactory(Retry, renderer),
                    BoundFactory(ToolTask([add], exact_answer), renderer)):
        clone = pickle.loads(pickle.dumps(factory))
        obs = env_run(clone({"prompt": "What is 1 + 1?", "answer": 2}).reset())
        assert obs.prompt_ids == env_run(factory({"prompt": "What is 1 + 1?", "answer": 2}).reset()).prompt_ids


class Overlapping(ScriptedEnv):
    """Records how many episodes are inside step() at once."""

    inside = 0
    most = 0

    async def step(self, c):
        import asyncio

        Overlapping.inside += 1
        Overlapping.most = max(Overlapping.most, Overlapping.inside)
        await asyncio.sleep(0)
        Overlapping.inside -= 1
        return await super().step(c)


def test_episodes_step_concurrently_and_share_one_engine_call_per_turn():
    engine = ScriptedEngine()
    runner = RolloutRunner(engine, lambda ex: Overlapping(ex, turns=3), SamplingParams(), 4,
                           tokenizer=IdsTokenizer(), limits=EpisodeLimits(max_turns=3))
    groups = runner.collect([(0, {}), (1, {}), (2, {})], seed=0)
    assert Overlapping.most == 12  # all 3 x 4 episodes were inside step() together
    assert [len(call) for call in engine.calls] == [3, 12, 12]  # one engine call per turn
    assert [call[0].n for call in engine.calls] == [4, 1, 1]
    assert all(s.turns == 3 for g in groups for s in g.samples)


def test_multi_turn_env_is_single_use():
    env = Retry({"prompt": "q"}, PromptRenderer(tiny_tokenizer()))
    with pytest.raises(RuntimeError, match="single-use"):
        env_run(env.step(Completion((1,), [2], [0.0], "length", 0)))
    obs = env_run(env.reset())
    with pytest.raises(RuntimeError, match="single-use"):
        env_run(env.reset())
    ids = tiny_tokenizer().encode("5")
    assert env_run(env.step(Completion(obs.prompt_ids, ids, [0.0] * len(ids), "length", 0))).done
    with pytest.raises(RuntimeError, match="single-use"):
        env_run(env.step(Completion(obs.prompt_ids + tuple(ids), ids, [0.0], "length", 0)))


class StopsAtOnceEngine(ScriptedEngine):
    """Sample 0 of every request (every request after the first turn) stops at once with no
    tokens (a plain OpenAI server does not report the stop token); the others as
    ScriptedEngine. `finish` for the empty one."""

    finish = "stop"

    async def generate(self, requests):
        out = await super().generate(requests)
        for comps, r in zip(out, requests):
            comps[0] = Completion(r.prompt_ids, [], [], self.finish, self.version)
        return out


def test_an_empty_turn_that_stopped_is_a_turn_and_an_empty_one_that_did_not_is_refused():
    def collect(engine):
        runner = RolloutRunner(engine, lambda ex: ScriptedEnv(ex, turns=2),
                               SamplingParams(max_new_tokens=2), 2, tokenizer=IdsTokenizer(),
                               limits=EpisodeLimits(max_turns=5))
        return runner.collect([(0, {"prompt": "x"})], seed=1)

    (group,) = collect(StopsAtOnceEngine())
    a, b = group.samples
    assert a.completion_ids == [7, 8, 9] and a.loss_mask == [0, 0, 0]  # two empty turns
    assert a.turns == 2 and a.reward == 1.25 and a.final_text == ""
    assert b.completion_ids == [1001, 1051, 7, 8, 9] and b.turns == 2  # turn 2: n=1, empty
    engine = StopsAtOnceEngine()
    engine.finish = "length"
    with pytest.raises(ContextError, match="no tokens that did not stop"):
        collect(engine)


class ClosingEnv(ScriptedEnv):
    """ScriptedEnv with a close() that counts; `fail_step` raises in step, `fail_close` in
    close."""

    closed: list = []

    def __init__(self, example, turns=3, fail_step=False, fail_close=False):
        super().__init__(example, turns)
        self.fail_step, self.fail_close = fail_step, fail_close

    async def step(self, c):
        if self.fail_step:
            raise RuntimeError("env broke")
        return await super().step(c)

    async def close(self):
        ClosingEnv.closed.append(self)
        if self.fail_close:
            raise OSError("session already gone")


def test_the_runner_closes_every_env_when_its_collection_ends():
    """Episodes cut by max_turns (never done), a collection that fails, and a close that
    raises (a warning, the groups still returned): each env's close() is awaited once."""
    ClosingEnv.closed = []
    (group,), _ = _collect(lambda ex: ClosingEnv(ex), EpisodeLimits(max_turns=1))
    assert len(group.samples) == 2 and len(ClosingEnv.closed) == 2  # cut, then closed
    assert len({id(e) for e in ClosingEnv.closed}) == 2
    ClosingEnv.closed = []
    with pytest.raises(RuntimeError, match="env broke"):
        _collect(lambda ex: ClosingEnv(ex, fail_step=True), EpisodeLimits(max_turns=5))
    assert len(ClosingEnv.closed) == 2
    ClosingEnv.closed = []
    with pytest.warns(RuntimeWarning, match="2 of 2 envs failed to close.*session already"):
        (group,), _ = _collect(lambda ex: ClosingEnv(ex, turns=1, fail_close=True),
                               EpisodeLimits(max_turns=5))
    assert [s.reward for s in group.samples] == [1.0, 1.0] and len(ClosingEnv.closed) == 2


class SyncClosingEnv(ScriptedEnv):
    closed = 0

    def close(self):  # a plain function: called, not awaited
        SyncClosingEnv.closed += 1
        if SyncClosingEnv.closed == 2:
            raise OSError("gone")


class SlowStepEnv(ScriptedEnv):
    """Sample 0's step fails at once; the others' steps are slow: they are cancelled (and
    waited for) before the envs close, so none still runs after the collection failed."""

    running = 0

    def __init__(self, example, member):
        super().__init__(example, turns=3)
        self.member = member

    async def step(self, c):
        if self.member == 0:
            raise RuntimeError("env broke")
        SlowStepEnv.running += 1
        try:
            await asyncio.sleep(30)
        finally:
            SlowStepEnv.running -= 1

    async def close(self):
        assert SlowStepEnv.running == 0, "closed while another env's step still ran"


def test_plain_close_functions_and_cancelled_steps():
    with pytest.warns(RuntimeWarning, match="1 of 2 envs failed to close.*gone"):
        _collect(lambda ex: SyncClosingEnv(ex, turns=1), EpisodeLimits(max_turns=5))
    assert SyncClosingEnv.closed == 2
    members = iter(range(2))
    with pytest.raises(RuntimeError, match="env broke"):
        _collect(lambda ex: SlowStepEnv(ex, next(members)), EpisodeLimits(max_turns=5))
    assert SlowStepEnv.running == 0
