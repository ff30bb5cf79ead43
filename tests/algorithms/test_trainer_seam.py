"""The trainer through the algorithm seam: GRPO's gradients equal the pre-seam computation
(grpo_token_loss, summed over policy tokens / their count, micro-batched); the normaliser an
algorithm names is the one used across micro-batches; KL as a loss and as a reward penalty;
the entropy bonus; reference log-probs computed once per batch."""

import copy
import dataclasses

import pytest
import torch

from traingym.algorithms import registry
from traingym.algorithms.losses import grpo_token_loss
from traingym.trainer.config import TrainerConfig
from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.trainer.logprobs import completion_logprobs
from traingym.trainer.torch_trainer import TorchTrainer
from traingym.core.types import Batch, Group, Sample

PROMPTS = [(5, 6, 7, 8), (9, 10, 11)]
COMPS = [[[20, 21, 22], [23, 24], [25, 26, 27], [28]], [[30, 31], [32, 33, 34, 35]]]
ADV = [[1.0, -0.5, 0.25, -0.75], [0.5, -0.5]]


def _algo(name, **knobs):
    cls = registry.get(name)
    return cls(dataclasses.replace(cls.resolve(None, 4), **knobs))


def _batch() -> Batch:
    groups = [Group([Sample(p, c, [0.0] * len(c), [0] * len(c), {}) for c in cs], i)
              for i, (p, cs) in enumerate(zip(PROMPTS, COMPS))]
    return Batch(groups, ADV)


def _grads(model, algorithm=None, micro=1) -> tuple[torch.Tensor, dict]:
    m = copy.deepcopy(model)
    cfg = TrainerConfig(lr=1e-2, bf16_autocast=False, micro_batch_groups=micro)
    t = TorchTrainer(m, cfg, 1.0, 0, algorithm=algorithm)
    batch = _batch()
    tokens = sum(len(c) for cs in COMPS for c in cs)
    stats = t.accumulate(batch.groups, batch.advantages_G, tokens,
                         denom=t.algorithm.denominator(batch))
    return torch.cat([p.grad.flatten() for p in m.parameters()]), stats


@pytest.fixture(scope="module")
def model():
    return tiny_model(tiny_tokenizer(), seed=3)


def test_grpo_gradients_equal_the_pre_seam_loss(model):
    m = copy.deepcopy(model)
    tokens = sum(len(c) for cs in COMPS for c in cs)
    for p, cs, adv in zip(PROMPTS, COMPS, ADV):  # the old accumulate, one group per pass
        out = completion_logprobs(m, [p], [cs], 1.0, 0)
        loss, _, _ = grpo_token_loss(out.logp_B_T, out.logp_B_T.detach(), torch.tensor(adv),
                                     0.2, 0.28)
        (loss * out.mask_B_T).sum().div(tokens).backward()
    want = torch.cat([p.grad.flatten() for p in m.parameters()])
    got, _ = _grads(model)
    assert torch.allclose(got, want, atol=1e-7, rtol=1e-5)
    got2, _ = _grads(model, micro=2)  # one pass over both groups: the same
    assert torch.allclose(got2, want, atol=1e-7, rtol=1e-5)


def test_gspo_and_dr_grpo_normalise_by_their_divisor(model):
    # on-policy every ratio is 1 (no clipping), so GSPO's gradient is sum_i A_i / |y_i| x
    # sum_t grad log p / n_samples, and Dr. GRPO's sum A_i grad log p / (n x max_new_tokens)
    m = copy.deepcopy(model)
    lens = [[len(c) for c in cs] for cs in COMPS]
    for p, cs, adv, ls in zip(PROMPTS, COMPS, ADV, lens):
        out = completion_logprobs(m, [p], [cs], 1.0, 0)
        w = torch.tensor([a / n for a, n in zip(adv, ls)])[:, None]
        (-(out.logp_B_T * out.mask_B_T) * w).sum().div(6).backward()
    want = torch.cat([p.grad.flatten() for p in m.parameters()])
    got, _ = _grads(model, _algo("gspo"))
    assert torch.allclose(got, want, atol=1e-7, rtol=1e-5)
    m = copy.deepcopy(model)
    for p, cs, adv in zip(PROMPTS, COMPS, ADV):
        out = completion_logprobs(m, [p], [cs], 1.0, 0)
        (-(out.logp_B_T * out.mask_B_T) * torch.tensor(adv)[:, None]).sum().div(6 * 4).backward()
    want = torch.cat([p.grad.flatten() for p in m.parameters()])
    got, _ = _grads(model, _algo("dr_grpo"), micro=2)
    assert torch.allclose(got, want, atol=1e-7, rtol=1e-5)


def test_kl_loss_entropy_bonus_and_one_reference_pass(model, monkeypatch):
    import traingym.trainer.torch_trainer as tt

    calls = []
    real = tt.completion_logprobs

    def counting(mdl, *a, **k):
        calls.append(mdl)
        return real(mdl, *a, **k)

    monkeypatch.setattr(tt, "completion_logprobs", counting)
    plain, s0 = _grads(model)
    calls.clear()
    algo = _algo("grpo", kl_coef=0.1, kl_estimator="k2", entropy_coef=0.01)
    m = copy.deepcopy(model)
    t = TorchTrainer(m, TrainerConfig(lr=1e-2, bf16_autocast=False, micro_batch_groups=1),
                     1.0, 0, algorithm=algo)
    calls.clear()
    batch = _batch()
    stats = t.accumulate(batch.groups, batch.advantages_G, 15)  # policy tokens
    refs = [c for c in calls if c is t.reference]
    assert len(refs) == 2 and calls[:2] == refs  # one per micro-batch, all before training
    assert stats["kl"] == 0.0  # the reference is the initial model: k2 = 0 at step 0
    got = torch.cat([p.grad.flatten() for p in m.parameters()])
    assert not torch.allclose(got, plain)  # the entropy bonus moved the gradient
    assert stats["entropy"] == pytest.approx(s0["entropy"])
    assert stats["loss"] == pytest.approx(s0["loss"] - 0.01 * s0["entropy"], rel=1e-5)


def test_kl_in_reward_reaches_the_advantages(model):
    algo = _algo("reinforce_pp", kl_coef=0.5, kl_in="reward")
    m = copy.deepcopy(model)
    t = TorchTrainer(m, TrainerConfig(lr=1e-2, bf16_autocast=False), 1.0, 0, algorithm=algo)
    with torch.no_grad():  # move the policy away from its reference
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = _batch()
    rows = [t._rows(batch.groups)]
    refs = [t._no_grad_logp(t.reference, rows[0])]
    (adv,) = t._token_advantages([(batch.groups, batch.advantages_G)], rows, refs)
    mask = completion_logprobs(m, PROMPTS, COMPS, 1.0, 0).mask_B_T.bool()
    assert adv[mask].mean().abs() < 1e-5 and (adv[mask].std(unbiased=False) - 1).abs() < 1e-3
    # within a sample the advantage changes along its tokens (the KL's return-to-go)
    assert (adv[0, 0] - adv[0, 2]).abs() > 1e-4
