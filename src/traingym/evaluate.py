"""Held-out evaluation: mean reward, greedy and sampled, with standard errors over prompts.

Sampled evaluation draws k samples per prompt; the standard error is over per-prompt means
(samples of one prompt are correlated, so treating them as independent would understate it).
A comparison of two evaluations on the same prompts uses the paired difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traingym.envs.base import EnvFactory
from traingym.envs.group import GroupReward
from traingym.envs.resources import RunResources
from traingym.rollout.runner import EpisodeLimits, RolloutRunner
from traingym.types import SamplingParams


@dataclass
class Score:
    mean: float
    se: float
    n_prompts: int
    per_prompt: list[float]

    def summary(self) -> dict:
        return {"mean": self.mean, "se": self.se, "n_prompts": self.n_prompts}


def _score(per_prompt: list[float]) -> Score:
    n = len(per_prompt)
    mean = sum(per_prompt) / n
    var = sum((x - mean) ** 2 for x in per_prompt) / (n - 1) if n > 1 else 0.0
    return Score(mean, math.sqrt(var / n), n, per_prompt)


def paired_difference(after: Score, before: Score) -> dict:
    diffs = [a - b for a, b in zip(after.per_prompt, before.per_prompt)]
    s = _score(diffs)
    return {"delta": s.mean, "se": s.se, "z": s.mean / s.se if s.se > 0 else None}


def evaluate(engine, factory: EnvFactory, rows: list[dict], temperature: float,
             samples_per_prompt: int, max_new_tokens: int, stop_ids: tuple[int, ...],
             seed: int, *, tokenizer, limits: EpisodeLimits = EpisodeLimits(),
             group_reward: GroupReward | None = None,
             resources: RunResources | None = None) -> dict[str, Score]:
    """Greedy (1 sample) and sampled (k samples at `temperature`) mean reward over rows, with
    the training run's episode limits and group hook (which sees a group of 1 when greedy).
    `resources`: the run's env resources (envs/resources.py); None: each runner its own."""
    out = {}
    for name, temp, k in (("greedy", 0.0, 1), ("sampled", temperature, samples_per_prompt)):
        params = SamplingParams(temperature=temp, max_new_tokens=max_new_tokens,
                                stop_token_ids=stop_ids)
        runner = RolloutRunner(engine, factory, params, k, tokenizer=tokenizer, limits=limits,
                               group_reward=group_reward, resources=resources)
        try:
            groups = runner.collect(list(enumerate(rows)), seed)
        finally:
            runner.close()
        out[name] = _score([sum(s.reward for s in g.samples) / len(g.samples) for g in groups])
    return out


def as_dict(scores: dict[str, Score]) -> dict:
    return {k: v.summary() for k, v in scores.items()}
