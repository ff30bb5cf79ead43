"""Group-relative advantages (GRPO, Shao et al. 2024).

Departures from the paper: std normalisation is optional (off follows Dr. GRPO, Liu et al.
2025, which shows it biases towards easy and hard prompts); groups whose rewards are all
equal carry no signal and are dropped and counted rather than trained on with zero advantage.

The loops do not call these (they build batches through the run's algorithm,
algorithms/registry.py); they are the reference GRPO is tested against
(tests/algorithms/test_advantages.py).
"""

from __future__ import annotations

import torch

from traingym.core.types import Batch, Group


def group_advantages(rewards_G: torch.Tensor, normalize_std: bool, eps: float = 1e-6) -> torch.Tensor:
    """Mean-centred rewards of one group, optionally divided by the group's std."""
    centred_G = rewards_G - rewards_G.mean()
    if normalize_std:
        centred_G = centred_G / (rewards_G.std(unbiased=False) + eps)
    return centred_G


def build_batch(groups: list[Group], normalize_std: bool = False) -> Batch:
    """Advantages for every group; groups with all-equal rewards are dropped and counted."""
    kept, advantages, dropped = [], [], 0
    for group in groups:
        rewards_G = torch.tensor([s.reward for s in group.samples], dtype=torch.float64)
        if bool((rewards_G == rewards_G[0]).all()):
            dropped += 1
            continue
        kept.append(group)
        advantages.append(group_advantages(rewards_G, normalize_std).tolist())
    return Batch(groups=kept, advantages_G=advantages, num_dropped_groups=dropped)
