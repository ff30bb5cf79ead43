"""Dr. GRPO ("GRPO done right"): no std normalisation, no length normalisation.

Paper: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"
(arXiv:2503.20783). Config: `algorithm.name = "dr_grpo"`.

Advantages are the group's mean-centred rewards (never divided by the std: `normalize_std`
defaults to False here; setting it True is allowed but is no longer Dr. GRPO). The per-token
loss is summed over each completion and divided by a constant, the number of samples in the
batch times `rollout.max_new_tokens`, instead of each completion's length, so no sample's
tokens are up- or down-weighted by its length.

Departures: the constant uses the batch's sample count (the paper's "mean over the group" of
sequence sums divided by the generation budget, taken over the whole batch); multi-turn
samples longer than max_new_tokens are not treated specially.
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
