"""Each algorithm's per-token loss, its gradient, its clipping edges and its normalisation
against values computed by hand; GRPO against the function it replaced (grpo_token_loss);
the KL estimators."""

import dataclasses
import math

import pytest
import torch

from traingym.algorithms import registry
from traingym.algorithms.losses import grpo_token_loss, kl_estimate
from traingym.core.types import Batch, Group, Sample


def _algo(name, **knobs):
    cls = registry.get(name)
    return cls(dataclasses.replace(cls.resolve(None, 8), **knobs))


def _close(t, want, rtol=1e-6):
    torch.testing.assert_close(t.detach().double(), torch.tensor(want, dtype=torch.float64),
                               rtol=rtol, atol=1e-9)


def _leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def test_grpo_loss_equals_the_old_function_off_policy():
    gen = torch.Generator().manual_seed(1)
    logp = (-torch.rand(5, 7, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    old = logp.detach() + (torch.rand(5, 7, generator=gen, dtype=torch.float64) - 0.5)
    adv = torch.randn(5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(5, 7, generator=gen) > 0.2).double()
    want, _, want_clip = grpo_token_loss(logp, old, adv, 0.2, 0.28)
    got, got_clip = _algo("grpo").token_loss(logp, old, adv[:, None], mask)
    assert torch.equal(got, want) and torch.equal(got_clip, want_clip)
    assert want_clip.sum() > 0  # the data reaches both clip edges
    assert torch.equal(_algo("grpo").token_weights(mask), mask)


@pytest.mark.parametrize("name", ["grpo", "dapo", "rloo", "reinforce_pp"])
def test_ppo_clip_edges(name):
    # ratios 1.28 exactly (at the edge: not clipped, full gradient), 1.5 (clipped for A > 0:
    # no gradient), 0.8 exactly and 0.5 (clipped for A < 0)
    d = torch.tensor([[math.log(1.28), math.log(1.5)]], dtype=torch.float64)
    r = d.exp()
    a = _algo(name, clip_low=0.2, clip_high=float(r[0, 0]) - 1)  # 1 + high == r exactly
    logp = _leaf(d.tolist())
    loss, clipped = a.token_loss(logp, torch.zeros_like(d), torch.tensor([[2.0]]), None)
    loss.sum().backward()
    edge = 1 + a.knobs.clip_high
    _close(loss, [[-2 * r[0, 0].item(), -2 * edge]])
    assert clipped.tolist() == [[0.0, 1.0]]
    _close(logp.grad, [[-2 * r[0, 0].item(), 0.0]])
    low = float(torch.tensor(math.log(0.8), dtype=torch.float64).exp())
    a = _algo(name, clip_low=1 - low, clip_high=0.28)
    logp = _leaf([[math.log(0.8), math.log(0.5)]])
    loss, clipped = a.token_loss(logp, torch.zeros(1, 2, dtype=torch.float64),
                                 torch.tensor([[-1.0]]), None)
    loss.sum().backward()
    assert clipped.tolist() == [[0.0, 1.0]]
    _close(logp.grad, [[low, 0.0]])


def test_gspo_sequence_ratio_clip_and_length_normalisation():
    a = _algo("gspo", clip_low=0.1, clip_high=0.1)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    old = torch.zeros(2, 3, dtype=torch.float64)
    # row 0: mean log ratio (0.1 + 0.0) / 2 -> s = e^0.05 (inside 1.1); the masked token's
    # value is ignored. row 1: mean 0.3 -> s = e^0.3 = 1.35 (clipped to 1.1 for A > 0)
    logp = _leaf([[0.1, 0.0, 5.0], [0.3, 0.3, 0.3]])
    loss, clipped = a.token_loss(logp, old, torch.tensor([[1.0], [1.0]]), mask)
    w = a.token_weights(mask)
    (loss * w).sum().backward()
    s0, s1 = math.exp(0.05), math.exp(0.3)
    assert loss[0, :2].tolist() == pytest.approx([-s0, -s0])
    assert s1 > 1.1 and loss[1].tolist() == pytest.approx([-1.1] * 3)  # cut to 1 + high
    assert clipped.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    _close(w, [[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    # gradient of s0 x A per token, weighted by 1/len: s0 / 2; clipped row: none
    _close(logp.grad, [[-s0 / 2, -s0 / 2, 0.0], [0.0, 0.0, 0.0]])
    batch = Batch([Group([Sample((1,), [2, 3], [0, 0], [0, 0], {}),
                          Sample((1,), [2], [0], [0], {})], 0)], [[1.0, -1.0]])
    assert a.denominator(batch) == 2.0  # mean over samples


def test_cispo_clips_the_weight_and_keeps_every_tokens_gradient():
    a = _algo("cispo", clip_low=0.2, clip_high=0.2)
    logp = _leaf([[math.log(2.0), math.log(1.1), math.log(0.5)]])
    loss, outside = a.token_loss(logp, torch.zeros(1, 3, dtype=torch.float64),
                                 torch.tensor([[3.0]]), None)
    loss.sum().backward()
    w = [1.2, 1.1, 0.8]  # clip(2.0), 1.1, clip(0.5)
    lp = [math.log(2.0), math.log(1.1), math.log(0.5)]
    assert loss[0].tolist() == pytest.approx([-wi * 3 * li for wi, li in zip(w, lp)])
    assert logp.grad[0].tolist() == pytest.approx([-3 * wi for wi in w])  # none is zero
    assert outside.tolist() == [[1.0, 0.0, 1.0]]


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.5]])
    d = -0.5
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(-d)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(d * d / 2)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(d) - d - 1)
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        kl_estimate(logp, ref, "k4")


def test_kl_as_reward_return_to_go_and_reinforce_pp_normalisation():
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    (grpo,) = _algo("grpo", kl_coef=0.5, kl_in="reward").token_advantages([(adv, kl, mask)])
    # advantage minus 0.5 x sum of this and later tokens' KL
    _close(grpo, [[1 - 0.3, 1 - 0.25, 1 - 0.15], [-1 - 0.2, -1, -1]])
    (rpp,) = _algo("reinforce_pp", kl_coef=0.5, kl_in="reward").token_advantages(
        [(adv, kl, mask)])
    x = torch.tensor([0.7, 0.75, 0.85, -1.2])  # the returns of the four policy tokens
    want = (x - x.mean()) / x.std(unbiased=False)
    assert rpp[mask.bool()].tolist() == pytest.approx(want.tolist(), rel=1e-4)
    assert rpp[~mask.bool()].tolist() == [0.0, 0.0]
