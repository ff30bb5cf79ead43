"""Dr. GRPO ("GRPO done right"): no std normalisation, no length normalisation.

Paper: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"
(arXiv:2503.20783). Config: `algorithm.name = "dr_grpo"`.

Advantages are the group's mean-centred rewards (`normalize_std` defaults to False). The loss is
summed per completion and divided by a constant, the batch's sample count x
`rollout.max_new_tokens`, so no sample's tokens are weighted by its length.

Departures: the constant uses the whole batch's sample count; multi-turn samples longer than
max_new_tokens are not treated specially.
"""

from __future__ import annotations

from traingym.algorithms.base import Algorithm
from traingym.core.types import Batch


class DrGRPO(Algorithm):
    name = "dr_grpo"
    DEFAULTS = {"normalize_std": False}

    def denominator(self, batch: Batch) -> float:
        samples = sum(len(g.samples) for g in batch.groups)
        return float(samples * self.knobs.max_new_tokens)
