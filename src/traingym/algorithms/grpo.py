"""GRPO: group-relative advantages with PPO's clipped surrogate.

Paper: Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300). Config: `algorithm.name = "grpo"`
(the default).

Departures from the paper (traingym's defaults since its first version, kept numerically:
tests/algorithms/test_grpo.py checks against the old functions' values):
- std normalisation is off by default (`normalize_std`; Dr. GRPO, Liu et al. 2025, shows it
  biases towards easy and hard prompts);
- the loss is averaged over all policy tokens of the batch (DAPO's token-level averaging),
  not per sequence then per group, so long completions are not down-weighted;
- clip-higher by default (clip_low 0.2, clip_high 0.28, from DAPO);
- groups whose rewards are all equal carry no signal and are dropped and counted;
- the KL to the reference is off by default (kl_coef 0), k3 when on, as in the paper.
"""

from __future__ import annotations

from traingym.algorithms.base import Algorithm


class GRPO(Algorithm):
    name = "grpo"
