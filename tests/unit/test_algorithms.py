import math

import pytest
import torch

from traingym.algorithms.advantages import build_batch, group_advantages
from traingym.algorithms.losses import grpo_token_loss
from traingym.core.types import Group, Sample


def _group(rewards, index=0):
    return Group([Sample((1,), [2], [0.0], [0], {}, reward=r) for r in rewards], index)


def test_group_advantages_mean_centred_and_std_normalised():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert group_advantages(r, False).tolist() == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages(r, True).tolist() == pytest.approx([1, -1, -1, 1], abs=1e-5)


def test_build_batch_drops_and_counts_equal_groups():
    batch = build_batch([_group([1, 1, 1]), _group([0, 1, 0], 1), _group([0, 0, 0], 2)])
    assert batch.num_dropped_groups == 2
    assert [g.index for g in batch.groups] == [1]
    assert batch.advantages_G[0] == pytest.approx([-1 / 3, 2 / 3, -1 / 3])


def test_grpo_loss_on_policy_gradient_is_minus_advantage():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, kl, clipped = grpo_token_loss(logp, logp.detach(), torch.tensor([0.5]), 0.2, 0.28)
    loss.sum().backward()
    assert loss.tolist() == [[-0.5, -0.5]]
    assert logp.grad.tolist() == [[-0.5, -0.5]]
    assert kl.tolist() == [[0.0, 0.0]] and clipped.sum() == 0


def test_grpo_loss_clips_ratio_asymmetrically():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]])
    loss_pos, _, clipped_pos = grpo_token_loss(logp, old, torch.tensor([1.0]), 0.2, 0.28)
    assert loss_pos[0].tolist() == pytest.approx([-1.28, -0.5])
    assert clipped_pos.tolist() == [[1.0, 0.0]]
    loss_neg, _, _ = grpo_token_loss(logp, old, torch.tensor([-1.0]), 0.2, 0.28)
    assert loss_neg[0].tolist() == pytest.approx([1.5, 0.8])


def test_k3_kl_matches_formula():
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.5]])
    loss, kl, _ = grpo_token_loss(logp, logp, torch.tensor([0.0]), 0.2, 0.2, ref, kl_coef=0.1)
    expected = math.exp(-0.5) + 0.5 - 1
    assert kl.item() == pytest.approx(expected)
    assert loss.item() == pytest.approx(0.1 * expected)
