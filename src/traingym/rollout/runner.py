"""Collect groups of scored samples: envs for each prompt, one engine call, then scoring.

Each example gets G single-use envs. Their first observations must be the same prompt (the
group shares it); the engine samples all G completions of a prompt in one request, so the
prompt is prefilled once. Environments step concurrently (asyncio), so slow reward code or
sandboxes overlap.

Covered: single-turn episodes. Multi-turn episodes are a later issue (envs/ for the protocol).
"""

from __future__ import annotations

import asyncio
from typing import Any

from traingym.envs.base import EnvFactory
from traingym.types import GenerationRequest, Group, SamplingParams


def stream_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and Python versions)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 1099511628211) & 0x7FFFFFFFFFFFFFFF
    return h


class RolloutRunner:
    def __init__(self, engine, factory: EnvFactory, params: SamplingParams, group_size: int):
        self.engine, self.factory = engine, factory
        self.params, self.group_size = params, group_size

    def collect(self, examples: list[tuple[int, dict[str, Any]]], seed: int) -> list[Group]:
        return asyncio.run(self._collect(examples, seed))

    async def _collect(self, examples, seed: int) -> list[Group]:
        envs = [[self.factory(row) for _ in range(self.group_size)] for _, row in examples]
        obs = [await asyncio.gather(*(e.reset() for e in group)) for group in envs]
        for (index, row), group_obs in zip(examples, obs):
            if any(o.prompt_ids != group_obs[0].prompt_ids for o in group_obs):
                raise ValueError(f"example {index}: the envs of one group gave different prompts")
        requests = [
            GenerationRequest(o[0].prompt_ids, self.group_size, self.params, stream_seed(seed, index))
            for (index, _), o in zip(examples, obs)
        ]
        completions = await self.engine.generate(requests)
        steps = [
            asyncio.gather(*(env.step(c) for env, c in zip(group, comps)))
            for group, comps in zip(envs, completions)
        ]
        groups = []
        for (index, _), results in zip(examples, await asyncio.gather(*steps)):
            samples = []
            for result in results:
                sample = result.info["sample"]
                sample.reward = result.reward
                samples.append(sample)
            groups.append(Group(samples=samples, index=index))
        return groups
