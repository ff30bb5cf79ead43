"""RLOO: REINFORCE with a leave-one-out baseline.

Paper: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
Learning from Human Feedback in LLMs" (arXiv:2402.14740); Kool et al. 2019 for the estimator.
Config: `algorithm.name = "rloo"`. A_i = r_i - mean_{j != i} r_j = G / (G - 1) x (r_i - mean_j
r_j); a group of one sample (or with all rewards equal) has no signal and is dropped and counted.

Departures: the loss is the PPO clipped surrogate with token-level averaging (as OpenRLHF and
TRL run RLOO), not the paper's sequence-level REINFORCE; with one optimizer step per batch the
ratio is 1, so the gradient equals REINFORCE's up to the token averaging. `normalize_std` is
ignored (RLOO's baseline is the leave-one-out mean).
"""

from __future__ import annotations

import torch

from traingym.algorithms.base import Algorithm


class RLOO(Algorithm):
    name = "rloo"

    def group_advantages(self, rewards_G: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        n = rewards_G.numel()
        if n < 2:
            return torch.zeros_like(rewards_G)
        return (rewards_G - rewards_G.mean()) * (n / (n - 1))
