"""REINFORCE++: REINFORCE with a global batch-normalised advantage, KL as a token reward.

Paper: Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models" (arXiv:2501.03262). Config: `algorithm.name = "reinforce_pp"`; the paper's KL penalty
is `algorithm.kl_coef > 0` with `kl_in = "reward"`.

Per token: the return is the sample's reward minus kl_coef x the KL's return-to-go, normalised
by the mean and std over every policy token of the batch (no per-prompt baseline: groups with
equal rewards are kept). Loss: PPO's clipped surrogate, token-level averaging.

Departures: KL as a reward penalty is refused with trainer.data_parallel > 1; the
"REINFORCE++-baseline" variant (group mean subtracted first) is not provided.
"""

from __future__ import annotations

import torch

from traingym.algorithms.base import Algorithm, return_to_go


def normalise(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(x - mean) / (std + eps), mean and population std weighted by `weight`."""
    total = weight.sum().clamp(min=1e-12)
    mean = (x * weight).sum() / total
    var = ((x - mean) ** 2 * weight).sum() / total
    return (x - mean) / (var.sqrt() + eps)


class ReinforcePP(Algorithm):
    name = "reinforce_pp"
    drop_equal_groups = False

    def batch_advantages(self, rewards, groups):
        if self.token_level:  # normalised per token in token_advantages
            return rewards
        r = torch.cat(rewards) if rewards else torch.zeros(0, dtype=torch.float64)
        lengths = torch.tensor([float(sum(s.loss_mask)) for g in groups for s in g.samples],
                               dtype=torch.float64)
        if r.numel() == 0:
            return []
        flat = normalise(r, lengths)
        return list(flat.split([len(x) for x in rewards]))

    def token_advantages(self, parts):
        beta = self.knobs.kl_coef
        returns = [adv_B[:, None] - beta * return_to_go(kl_B_T * mask_B_T)
                   for adv_B, kl_B_T, mask_B_T in parts]
        masks = [m for _, _, m in parts]
        x = torch.cat([r[m.bool()] for r, m in zip(returns, masks)])
        total = x.numel()
        mean = x.mean() if total else x.new_zeros(())
        std = x.std(unbiased=False) if total else x.new_zeros(())
        return [(r - mean) / (std + 1e-6) * m for r, m in zip(returns, masks)]
