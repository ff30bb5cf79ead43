"""The environment seam. An Env is single-use and async: one episode, then discarded.

An EnvFactory builds an Env for one dataset row and must be picklable, so envs can be built
wherever the rollout runs. Multi-turn `step`s return observations that extend the context so
far; the runner checks that prefix (envs/transcript.py). A StepResult's `drop` names why a
sample must be neither trained on nor counted. An env holding something per episode may define
`close()` (async or plain): called once when its collection ends, however it ended, and safe
after the env released things itself. Helpers: envs/single_turn.py, envs/multi_turn.py,
envs/tools.py.
"""

from __future__ import annotations

from typing import Any, Protocol

from traingym.core.types import Completion, Observation, StepResult


class Env(Protocol):
    async def reset(self) -> Observation:
        """Start the episode and return the first prompt."""
        ...

    async def step(self, completion: Completion) -> StepResult:
        """Score the policy's completion; `done=False` continues the episode."""
        ...


class EnvFactory(Protocol):
    def __call__(self, example: dict[str, Any]) -> Env: ...
