"""A toy algorithm: GRPO's advantages times its own knob `toy_scale` (`algorithm.toy_scale`),
reporting its own metric `toy_adv_abs_mean` (the mean |advantage| of the batch) in each step
record. Test-only: proof that an algorithm is one file plus one registry line.
"""

from __future__ import annotations

from pydantic import Field

from traingym.algorithms.base import Algorithm
from traingym.core.errors import Strict


class ToyAlgorithm(Algorithm):
    name = "toy"

    class Options(Strict):
        toy_scale: float = Field(1.0, gt=0, description="multiplies GRPO's advantages")

    def batch_advantages(self, rewards, groups):
        return [a * self.options.toy_scale for a in super().batch_advantages(rewards, groups)]

    def metrics(self, batch):
        flat = [abs(a) for adv in batch.advantages_G for a in adv]
        return {"toy_adv_abs_mean": sum(flat) / len(flat) if flat else 0.0}
