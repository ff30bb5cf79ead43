"""GRPO: group-relative advantages with PPO's clipped surrogate.

Paper: Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300). Config: `algorithm.name = "grpo"`
(the default).

Departures from the paper: std normalisation off by default (Dr. GRPO, Liu et al. 2025, shows
it biases towards easy and hard prompts); the loss averaged over all policy tokens of the batch
(DAPO), so long completions are not down-weighted; clip-higher (0.2 / 0.28, DAPO); groups with
all-equal rewards dropped and counted; the KL to the reference off by default (k3 when on).
"""

from __future__ import annotations

from traingym.algorithms.base import Algorithm


class GRPO(Algorithm):
    name = "grpo"
