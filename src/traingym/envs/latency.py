"""An environment with heavy-tailed latency: the single-turn env over a reward function, whose
step first waits (asyncio, so other episodes go on) a lognormal time.

Stands in for a slow verifier, a sandbox or a remote judge in benchmarks and tests. With
`sigma` 1.0 the p99 wait is about 10x the median (exp(2.33 sigma)). The n-th use of a prompt in
a run draws its wait from an RNG seeded by (seed, prompt, n), so a sync and an async run over the
same prompts wait the same times for the same first attempts. The draw counts belong to the
run (envs/resources.py; in async mode, to each engine process): a second run in the same
process starts again from n = 0.

Not covered: latency that depends on the completion; waits that block the event loop.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from traingym.core.types import Completion, Observation, StepResult
from traingym.envs.resources import current
from traingym.envs.single_turn import SingleTurnEnv


@dataclass
class DelayedReward:
    """Env maker (example, renderer) -> Env; picklable when `reward_fn` is module-level."""

    reward_fn: Callable
    median_s: float
    sigma: float = 1.0
    seed: int = 0

    def delay(self, prompt: str) -> float:
        uses = current().keep(("latency.draws",), Counter)  # how often each prompt was drawn
        n = uses[prompt]
        uses[prompt] += 1
        rng = random.Random(f"{self.seed}|{prompt}|{n}")
        return self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    def __call__(self, example: dict[str, Any], renderer) -> DelayedEnv:
        return DelayedEnv(SingleTurnEnv(example, self.reward_fn, renderer),
                          self.delay(str(example["prompt"])))


class DelayedEnv:
    def __init__(self, inner: SingleTurnEnv, delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    async def reset(self) -> Observation:
        return await self.inner.reset()

    async def step(self, completion: Completion) -> StepResult:
        await asyncio.sleep(self.delay_s)
        return await self.inner.step(completion)
