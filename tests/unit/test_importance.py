"""Importance-sampling weights token by token: tis and mis, token and sequence level, the
mask, and the weight entering the loss without a gradient."""

import math

import pytest
import torch

from traingym.algorithms.importance import importance_sums, importance_weights
from traingym.algorithms.losses import grpo_token_loss

# Two samples, three token slots; the second sample has a padded (masked) last slot.
TRAINER = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, 0.0]])
ENGINE = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -3.2, -9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# log ratios: [[0.5, -1.0, 0.0], [1.0, 0.2, (masked)]]


def _w(mode, level, cap=2.0):
    return importance_weights(TRAINER, ENGINE, MASK, mode, level, cap)


def test_tis_token_truncates_each_token():
    e = math.exp
    expected = torch.tensor([[e(0.5), e(-1.0), 1.0], [2.0, e(0.2), 0.0]])  # e(1.0) > 2 -> 2
    assert torch.allclose(_w("tis", "token"), expected)


def test_mis_token_zeroes_tokens_over_the_cap():
    e = math.exp
    expected = torch.tensor([[e(0.5), e(-1.0), 1.0], [0.0, e(0.2), 0.0]])
    assert torch.allclose(_w("mis", "token"), expected)


def test_sequence_level_shares_one_product_weight():
    # sequence log ratios: 0.5 - 1.0 + 0.0 = -0.5; 1.0 + 0.2 = 1.2 (exp 3.32 > cap 2)
    tis = _w("tis", "sequence")
    assert torch.allclose(tis, torch.tensor([[math.exp(-0.5)] * 3, [2.0, 2.0, 0.0]]))
    mis = _w("mis", "sequence")
    assert torch.allclose(mis, torch.tensor([[math.exp(-0.5)] * 3, [0.0, 0.0, 0.0]]))
    loose = _w("mis", "sequence", cap=4.0)
    assert torch.allclose(loose, torch.tensor([[math.exp(-0.5)] * 3, [math.exp(1.2)] * 2 + [0.0]]))


def test_huge_sequence_ratio_does_not_overflow():
    t = torch.zeros(1, 200)
    e = torch.full((1, 200), -50.0)  # log ratio 50 per token: exp(10000) overflows
    m = torch.ones(1, 200)
    tis = importance_weights(t, e, m, "tis", "sequence", 2.0)
    assert torch.equal(tis, torch.full((1, 200), 2.0))
    assert torch.equal(importance_weights(t, e, m, "mis", "sequence", 2.0), torch.zeros(1, 200))


def test_none_is_the_mask_and_bad_names_fail():
    assert torch.equal(_w("none", "token"), MASK.float())
    with pytest.raises(ValueError, match="mode"):
        _w("clip", "token")
    with pytest.raises(ValueError, match="level"):
        _w("tis", "batch")


def test_sums_count_policy_tokens_only():
    w = _w("mis", "token")
    sums = importance_sums(w, MASK)
    assert sums["is_zero_frac"] == 1.0  # one policy token zeroed; the padded slot not counted
    assert math.isclose(sums["is_weight_mean"], float(w.sum()), rel_tol=1e-6)


def test_weight_scales_the_policy_gradient_without_a_gradient_of_its_own():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([1.0])
    w = torch.tensor([[0.5, 0.0]], requires_grad=True)
    loss, _, _ = grpo_token_loss(logp, logp.detach(), adv, 0.2, 0.28, is_weight_B_T=w)
    loss.sum().backward()
    # d(-ratio * A * w)/dlogp at ratio 1 = -A * w
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, 0.0]]))
    assert w.grad is None
