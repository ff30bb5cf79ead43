"""PPO with a value head and GAE (algorithms/ppo.py, trainer/value_head.py): GAE and the
clipped value loss against hand-computed values; the value head in the trainer (gradients,
kept out of export(), saved and restored by checkpoints); config refusals; the tiny task
with reward rising."""

import copy
import dataclasses
import json
import statistics

import pytest
import torch
from safetensors.torch import load_file

import traingym
from traingym.algorithms import registry
from traingym.algorithms.ppo import PPO, clipped_value_loss, explained_variance, gae
from traingym.core.errors import ConfigError
from traingym.trainer.config import TrainerConfig
from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.observability.events import read_events
from traingym.observability.schema import check_step
from traingym.trainer.torch_trainer import TorchTrainer
from traingym.trainer.value_head import value_targets
from traingym.core.types import Batch, Group, Sample


def _t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def _ppo(**knobs):
    own = {k: knobs.pop(k) for k in list(knobs) if k in PPO.Options.model_fields}
    return PPO(dataclasses.replace(PPO.resolve(None, 4), **knobs), PPO.Options(**own))


# -- GAE by hand -------------------------------------------------------------------------------

def test_gae_by_hand_gamma_1_lam_095():
    r, v, m = _t([0.0, 0.0, 1.0]), _t([0.5, 0.2, 0.4]), _t([1.0, 1.0, 1.0])
    adv, ret = gae(r, v, m, 1.0, 0.95)
    # deltas: t2 = 1 - 0.4 = 0.6; t1 = 0 + 0.4 - 0.2 = 0.2; t0 = 0 + 0.2 - 0.5 = -0.3
    a2 = 0.6
    a1 = 0.2 + 0.95 * a2  # 0.77
    a0 = -0.3 + 0.95 * a1  # 0.4315
    assert torch.allclose(adv, _t([a0, a1, a2]))
    assert torch.allclose(ret, _t([a0 + 0.5, a1 + 0.2, a2 + 0.4]))


def test_gae_lam_1_is_returns_minus_values_and_lam_0_is_one_step_td():
    r, v, m = _t([0.1, -0.2, 1.0]), _t([0.5, 0.2, 0.4]), _t([1.0, 1.0, 1.0])
    adv, ret = gae(r, v, m, 1.0, 1.0)  # A_t = sum_{s>=t} r_s - V_t
    assert torch.allclose(adv, _t([0.9 - 0.5, 0.8 - 0.2, 1.0 - 0.4]))
    assert torch.allclose(ret, _t([0.9, 0.8, 1.0]))  # returns = Monte Carlo returns
    adv, _ = gae(r, v, m, 0.9, 1.0)  # discounted: 0.1 + 0.9 (-0.2) + 0.81 (1.0) = 0.73
    assert torch.allclose(adv, _t([0.73 - 0.5, -0.2 + 0.9 - 0.2, 1.0 - 0.4]))
    adv, _ = gae(r, v, m, 0.9, 0.0)  # delta_t = r_t + gamma V_{t+1} - V_t
    assert torch.allclose(adv, _t([0.1 + 0.9 * 0.2 - 0.5, -0.2 + 0.9 * 0.4 - 0.2, 1.0 - 0.4]))


def test_gae_skips_masked_tokens_and_padding():
    # policy, policy, env, env, policy, pad: the env tokens are not steps (no discount, no
    # bootstrap through them); the result equals GAE over the three policy tokens
    r = _t([0.0, 0.3, 9.0, 9.0, 1.0, 7.0], [2.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    v = _t([0.5, 0.2, 9.0, 9.0, 0.4, 7.0], [0.1, 0.0, 0.0, 0.0, 0.0, 0.0])
    m = _t([1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0])
    adv, ret = gae(r, v, m, 0.9, 0.8)
    want_adv, want_ret = gae(_t([0.0, 0.3, 1.0]), _t([0.5, 0.2, 0.4]), _t([1, 1, 1]), 0.9, 0.8)
    assert torch.allclose(adv[0, [0, 1, 4]], want_adv[0]) and torch.allclose(
        ret[0, [0, 1, 4]], want_ret[0])
    assert adv[0, [2, 3, 5]].abs().sum() == 0 and ret[0, [2, 3, 5]].abs().sum() == 0
    assert torch.allclose(adv[1], _t([2.0 - 0.1, 0, 0, 0, 0, 0])[0])  # one token: r - V


def test_value_advantages_put_the_reward_last_subtract_kl_and_whiten_over_the_batch():
    mask_a = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])  # row 2: an env token inside
    mask_b = torch.tensor([[1.0, 0.0, 0.0]])
    values_a = torch.tensor([[0.2, 0.1, 0.0], [0.3, 0.0, -0.1]])
    values_b = torch.tensor([[0.4, 0.0, 0.0]])
    kl_a = torch.tensor([[0.5, 1.0, 0.0], [0.0, 0.0, 2.0]])
    parts = [(torch.tensor([1.0, 0.0]), kl_a, values_a, mask_a),
             (torch.tensor([0.5]), torch.zeros(1, 3), values_b, mask_b)]
    algo = _ppo(kl_coef=0.1, kl_in="reward", gamma=1.0, lam=1.0, whiten_advantages=False)
    advs, rets = algo.value_advantages(parts)
    # row 1: rewards (-0.05, 1 - 0.1); returns-to-go (0.85, 0.9) minus V
    assert torch.allclose(advs[0][0], torch.tensor([0.85 - 0.2, 0.9 - 0.1, 0.0]))
    # row 2: rewards (0, -, 0 - 0.2) over its policy tokens 0 and 2
    assert torch.allclose(advs[0][1], torch.tensor([-0.2 - 0.3, 0.0, -0.2 + 0.1]))
    assert torch.allclose(advs[1], torch.tensor([[0.5 - 0.4, 0.0, 0.0]]))
    assert torch.allclose(rets[0][0], torch.tensor([0.85, 0.9, 0.0]))
    white, rets_w = _ppo(kl_coef=0.1, kl_in="reward", lam=1.0).value_advantages(parts)
    flat = torch.tensor([0.65, 0.8, -0.5, -0.1, 0.1])  # every policy token of the batch
    want = (flat - flat.mean()) / flat.std(unbiased=False)
    got = torch.cat([white[0][mask_a > 0], white[1][mask_b > 0]])
    assert torch.allclose(got, want, atol=1e-6)
    assert white[0][1, 1] == 0 and white[1][0, 1:].abs().sum() == 0  # off the mask
    assert all(torch.equal(a, b) for a, b in zip(rets, rets_w))  # returns before whitening


# -- the value loss -----------------------------------------------------------------------------

def test_clipped_value_loss_by_hand():
    old, ret = torch.tensor([0.0, 0.0, 0.0, 1.0]), torch.tensor([1.0, -1.0, 0.1, 1.0])
    new = torch.tensor([0.5, 0.5, 0.3, 1.1])
    loss, clipped = clipped_value_loss(new, old, ret, 0.2)
    # V_clip = (0.2, 0.2, 0.2, 1.1); plain (0.25, 2.25, 0.04, 0.01); clipped (0.64, 1.44,
    # 0.01, 0.01): max picks 0.64 (clipped binds), 2.25, 0.04, 0.01
    assert torch.allclose(loss, 0.5 * torch.tensor([0.64, 2.25, 0.04, 0.01]))
    assert clipped.tolist() == [1.0, 0.0, 0.0, 0.0]
    loss0, clipped0 = clipped_value_loss(new, old, ret, 0.0)  # clip off: plain
    assert torch.allclose(loss0, 0.5 * torch.tensor([0.25, 2.25, 0.04, 0.01]))
    assert clipped0.sum() == 0
    v = new.clone().requires_grad_(True)  # the gradient flows only where the plain term won
    clipped_value_loss(v, old, ret, 0.2)[0].sum().backward()
    assert torch.allclose(v.grad, torch.tensor([0.0, 1.5, 0.2, 0.1]))
    assert explained_variance(ret, ret) == 1.0 and explained_variance(ret, ret * 0 + 1) is None


# -- the value head in the trainer --------------------------------------------------------------

PROMPTS = [(5, 6, 7, 8), (9, 10, 11)]
COMPS = [[[20, 21, 22], [23, 24]], [[30, 31, 32, 33], [34]]]
MASKS = [[[1, 1, 1], [1, 1]], [[1, 0, 0, 1], [1]]]  # sample 3: two env tokens inside
REWARDS = [[1.0, 0.0], [0.5, 0.25]]


@pytest.fixture(scope="module")
def model():
    return tiny_model(tiny_tokenizer(), seed=3)


def _trainer(model, **knobs):
    cfg = TrainerConfig(lr=1e-2, bf16_autocast=False, micro_batch_groups=1)
    return TorchTrainer(copy.deepcopy(model), cfg, 1.0, 0, algorithm=_ppo(**knobs))


def _batch() -> Batch:
    groups = [Group([Sample(p, c, [0.0] * len(c), [0] * len(c), {}, loss_mask=m, reward=r)
                     for c, m, r in zip(cs, ms, rs)], i)
              for i, (p, cs, ms, rs) in enumerate(zip(PROMPTS, COMPS, MASKS, REWARDS))]
    return PPO(PPO.resolve(None, 4)).build_batch(groups)


def test_value_targets_are_gae_over_policy_tokens_of_the_heads_values(model):
    t = _trainer(model, whiten_advantages=False, gamma=0.9, lam=0.8)
    with torch.no_grad():
        t.value_head.weight.normal_(0, 0.5)  # a non-zero head: values that differ per token
        t.value_head.bias.fill_(0.1)
    batch = _batch()
    assert batch.advantages_G == REWARDS and batch.num_dropped_groups == 0  # no dropping
    chunks = t._chunks(batch.groups, batch.advantages_G)
    targets = value_targets(t, chunks, [t._rows(c) for c, _ in chunks], [None, None])
    v = targets.old_values[1][0]  # sample 3 (mask 1 0 0 1): GAE over tokens 0 and 3
    assert v[1] == 0 and v[2] == 0 and v[0] != 0
    a3 = 0.5 - v[3]
    a0 = 0.0 + 0.9 * v[3] - v[0] + 0.9 * 0.8 * a3
    assert torch.allclose(targets.advantages[1][0], torch.stack(
        [a0, v.new_zeros(()), v.new_zeros(()), a3]), atol=1e-6)
    assert torch.allclose(targets.returns[1][0][[0, 3]], torch.stack([a0 + v[0], a3 + v[3]]))
    assert set(targets.stats) == {"value_mean", "value_return_mean", "value_explained_var"}


def test_value_head_trains_and_never_leaves_the_trainer(model):
    t = _trainer(model)
    before = {k: v.clone() for k, v in t.export().items()}
    assert before.keys() == model.state_dict().keys()  # the policy's weights only
    assert not any("value" in k for k in before)
    stats = t.train_step(_batch())
    for key in ("value_loss", "value_mean", "value_return_mean", "value_clip_frac"):
        assert isinstance(stats[key], float), key
    assert stats["value_mean"] == 0.0 and stats["value_loss"] > 0  # zero-initialised head
    assert stats["value_clip_frac"] == 0.0  # one step per batch: V = V_old in value
    assert t.value_head.weight.abs().sum() > 0  # trained by the policy's optimizer
    assert t.export().keys() == before.keys()
    assert [g["lr"] for g in t.optimizer.param_groups] == [1e-2, 1e-2]
    t2 = _trainer(model, value_lr_scale=3.0)
    assert t2.optimizer.param_groups[1]["lr"] == pytest.approx(3e-2)


# -- config --------------------------------------------------------------------------------------

def test_config_refusals_name_the_fix():
    def cfg(**over):
        return traingym.build_config("tiny", overrides=over)

    assert cfg(algorithm={"name": "ppo", "lam": 0.9}).algorithm.lam == 0.9
    assert registry.get("ppo") is PPO
    with pytest.raises(ConfigError, match=r"applies only to an algorithm that has that option \(ppo\)"):
        cfg(algorithm={"name": "grpo", "vf_coef": 0.5})
    with pytest.raises(ConfigError, match="set trainer.data_parallel = 1"):
        cfg(algorithm={"name": "ppo"}, trainer={"data_parallel": 2})
    with pytest.raises(ConfigError, match="set lora.rank = 0"):
        cfg(algorithm={"name": "ppo"}, lora={"rank": 4})
    with pytest.raises(ConfigError, match="unknown key 'algorithm.lamda'"):
        cfg(algorithm={"name": "ppo", "lamda": 0.9})
    with pytest.raises(ConfigError, match="lam"):
        cfg(algorithm={"name": "ppo", "lam": 1.5})


# -- runs ------------------------------------------------------------------------------------------

def _run_cfg(steps, **over):
    return traingym.build_config("tiny", overrides={
        "steps": steps, "threads": 1, "seed": 0, "trainer": {"lr": 2e-2},
        "algorithm": {"name": "ppo"}, "eval": {"before": False, "after": False}, **over})


def test_ppo_reward_rises_on_the_tiny_task(tmp_path):
    traingym.train(_run_cfg(14), run_dir=tmp_path / "run", progress=False)
    events = read_events(tmp_path / "run")
    rewards = [e["reward_mean"] for e in events]
    assert len(rewards) == 14 and all(e["trained_tokens"] > 0 for e in events)
    first, last = statistics.fmean(rewards[:4]), statistics.fmean(rewards[-4:])
    assert last > first + 0.1, rewards
    assert all(e["groups_dropped"] == 0 for e in events)
    assert events[0]["value_mean"] == 0.0 and events[-1]["value_mean"] != 0.0
    for e in events:
        assert not check_step(e), check_step(e)


def test_resume_restores_the_value_head_exactly(tmp_path):
    ck = {"checkpoint": {"every": 2}}
    straight, split = tmp_path / "straight", tmp_path / "split"
    traingym.train(_run_cfg(4, **ck), run_dir=straight, progress=False)
    traingym.train(_run_cfg(2, **ck), run_dir=split, progress=False)
    assert (split / "checkpoints/step_000002/value_head.safetensors").is_file()
    model_keys = load_file(split / "checkpoints/step_000002/model.safetensors").keys()
    assert not any("value" in k for k in model_keys)  # serve/eval load the policy only
    traingym.train(_run_cfg(4, **ck), run_dir=split, resume=True, progress=False)
    a, b = straight / "checkpoints/step_000004", split / "checkpoints/step_000004"
    for name in ("value_head.safetensors", "model.safetensors", "optimizer.safetensors"):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), f"{name}:{key} differs"
    assert load_file(a / "value_head.safetensors")["weight"].abs().sum() > 0
    assert json.loads((a / "optimizer.json").read_text()) == json.loads(
        (b / "optimizer.json").read_text())
    va = [e["value_mean"] for e in read_events(straight)]
    assert va == [e["value_mean"] for e in read_events(split)]


def test_a_checkpoint_loads_only_with_the_modules_it_holds(tmp_path, model):
    from traingym.runs import checkpoint

    t = _trainer(model)
    t.train_step(_batch())
    folder = checkpoint.save(tmp_path, 1, t.model, t.optimizer, {}, keep=2,
                             extra=checkpoint.extra_modules(t))
    t2 = _trainer(model)
    checkpoint.load(folder, t2.model, t2.optimizer, checkpoint.extra_modules(t2))
    assert torch.equal(t2.value_head.weight, t.value_head.weight)
    plain = TorchTrainer(copy.deepcopy(model), TrainerConfig(bf16_autocast=False), 1.0, 0)
    with pytest.raises(checkpoint.CheckpointError, match=r"holds modules \['value_head'\].*"
                       "algorithm.name='ppo'"):
        checkpoint.load(folder, plain.model, plain.optimizer, checkpoint.extra_modules(plain))


def test_hidden_states_agree_between_the_shared_prompt_and_full_row_paths(model):
    from traingym.trainer.logprobs import completion_logprobs
    from traingym.trainer.micro import sequence_logprobs

    masks = MASKS
    with torch.no_grad():
        a = completion_logprobs(model, PROMPTS, COMPS, 1.0, 0, masks, hidden=True)
        b = sequence_logprobs(model, PROMPTS, COMPS, 1.0, 0, masks, hidden=True)
    assert a.hidden_B_T_H.shape == (4, 4, model.config.hidden_size)
    m = a.mask_B_T[..., None]
    assert torch.allclose(a.hidden_B_T_H * m, b.hidden_B_T_H * m, atol=1e-4)
    # the hidden state before token t is what the LM head turns into token t's log-prob
    logits = model.get_output_embeddings()(a.hidden_B_T_H).log_softmax(-1)
    ids = torch.tensor([c + [0] * (4 - len(c)) for cs in COMPS for c in cs])
    assert torch.allclose(logits.gather(-1, ids[..., None])[..., 0] * a.mask_B_T, a.logp_B_T,
                          atol=1e-5)
    assert a.hidden_B_T_H.requires_grad is False and completion_logprobs(
        model, PROMPTS, COMPS, 1.0, 0).hidden_B_T_H is None


def test_gradient_checkpointing_path_gives_the_same_ppo_gradients(model):
    grads = []
    for gc in (False, True):
        cfg = TrainerConfig(lr=1e-2, bf16_autocast=False, gradient_checkpointing=gc)
        t = TorchTrainer(copy.deepcopy(model), cfg, 1.0, 0, algorithm=_ppo())
        with torch.no_grad():
            t.value_head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
        batch = _batch()
        stats = t.accumulate(batch.groups, batch.advantages_G, 10, denom=10.0)
        assert stats["value_loss"] > 0
        grads.append(torch.cat([p.grad.flatten() for p in [*t.model.parameters(),
                                                            *t.value_head.parameters()]]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_kl_in_reward_reaches_the_gae_returns_through_the_trainer(model):
    from traingym.trainer.logprobs import completion_logprobs

    knobs = {"whiten_advantages": False, "lam": 1.0, "gamma": 1.0}
    t = _trainer(model, kl_coef=0.5, kl_in="reward", kl_estimator="k1", **knobs)
    with torch.no_grad():
        for p in t.reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    plain = _trainer(model, **knobs)
    batch = _batch()
    got = []
    for tr in (t, plain):
        chunks = tr._chunks(batch.groups, batch.advantages_G)
        rows = [tr._rows(c) for c, _ in chunks]
        refs = ([tr._no_grad_logp(tr.reference, r) for r in rows] if tr.reference is not None
                else [None] * len(rows))
        got.append(value_targets(tr, chunks, rows, refs).returns)
    with torch.no_grad():  # group 2: k1 KL per policy token, its return-to-go over them
        pol = completion_logprobs(model, [PROMPTS[1]], [COMPS[1]], 1.0, 0, [MASKS[1]])
        ref = completion_logprobs(t.reference, [PROMPTS[1]], [COMPS[1]], 1.0, 0, [MASKS[1]])
    kl = (pol.logp_B_T - ref.logp_B_T) * pol.mask_B_T
    rtg = kl.flip(-1).cumsum(-1).flip(-1) * pol.mask_B_T
    assert kl.abs().sum() > 0
    assert torch.allclose(got[0][1] - got[1][1], -0.5 * rtg, atol=1e-5)
