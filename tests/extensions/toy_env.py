"""A toy env adapter: `task.env = "toy:<chars>"`; each episode is one turn on the dataset row,
rewarded by the fraction of the completion's characters that are in <chars>. Every step
reports {"toy_env": <chars>, "pid": <process>} as its info (samples.jsonl env_info).
Test-only: proof that an env adapter is one file (its maker and its `ADAPTER` record) plus one
registry line in envs/adapters.py's ADAPTERS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from traingym.core.types import Observation, StepResult
from traingym.envs.adapters import Abilities, Adapter


class ToyEnv:
    def __init__(self, example: dict[str, Any], renderer, chars: str):
        self.example, self.renderer, self.chars = example, renderer, chars

    async def reset(self) -> Observation:
        return Observation(self.renderer.ids(self.example), self.renderer.text(self.example))

    async def step(self, completion) -> StepResult:
        text = self.renderer.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        reward = sum(c in self.chars for c in text) / max(len(text), 1)
        return StepResult(reward=reward, done=True,
                          info={"toy_env": self.chars, "pid": os.getpid()})


@dataclass(frozen=True)
class ToyMaker:
    """Picklable env maker (example, renderer) -> ToyEnv; the adapter's factory (spec rest)."""

    chars: str
    env_adapter = "toy"  # its name in ADAPTERS (not a field)

    def __call__(self, example: dict[str, Any], renderer) -> ToyEnv:
        return ToyEnv(example, renderer, self.chars)


ADAPTER = Adapter("toy:", "extensions.toy_env:ToyMaker", Abilities(), "toy:<chars>")
