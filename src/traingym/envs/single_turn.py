"""Single-turn environments: a dataset row plus a plain reward function.

The reward function is `def reward(sample: Sample) -> float`. If it raises, the run stops with
a RewardError naming the sample that caused it; it is never turned into a silent 0.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from traingym.core.types import Completion, Observation, Sample, StepResult
from traingym.envs.render import PromptRenderer

RewardFn = Callable[[Sample], float]


class RewardError(RuntimeError):
    """A reward function raised or returned a non-number; carries the offending sample."""

    def __init__(self, message: str, sample: Sample):
        super().__init__(message)
        self.sample = sample


def score(reward_fn: RewardFn, sample: Sample) -> float:
    """Call the user's reward function; any failure names the sample."""
    where = (f"\n  prompt: {sample.prompt_text[-200:]!r}\n  completion: "
             f"{sample.completion_text!r}\n  example: {sample.example!r}")
    try:
        value = reward_fn(sample)
    except Exception as e:  # re-raised with the sample attached, never swallowed
        raise RewardError(f"reward function {getattr(reward_fn, '__name__', reward_fn)!s} raised "
                          f"{type(e).__name__}: {e}{where}", sample) from e
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RewardError(f"reward function returned {value!r}; it must return a finite float"
                          f"{where}", sample)
    return float(value)


class SingleTurnEnv:
    def __init__(self, example: dict[str, Any], reward_fn: RewardFn, renderer: PromptRenderer):
        self.example, self.reward_fn, self.renderer = example, reward_fn, renderer
        self._obs: Observation | None = None
        self._done = False

    async def reset(self) -> Observation:
        self._obs = Observation(self.renderer.ids(self.example), self.renderer.text(self.example))
        return self._obs

    async def step(self, completion: Completion) -> StepResult:
        if self._obs is None or self._done:
            raise RuntimeError("SingleTurnEnv is single-use: reset() once, then step() once")
        self._done = True
        sample = to_sample(self.example, self._obs, completion, self.renderer.tokenizer)
        return StepResult(reward=score(self.reward_fn, sample), done=True, info={"sample": sample})


def to_sample(example, obs: Observation, completion: Completion, tokenizer) -> Sample:
    text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    return Sample(
        prompt_ids=obs.prompt_ids,
        completion_ids=list(completion.token_ids),
        completion_logprobs=list(completion.logprobs),
        versions=[completion.version] * len(completion.token_ids),
        example=example,
        prompt_text=obs.text,
        completion_text=text,
        finish_reason=completion.finish_reason,
        final_text=text,
        routes=completion.routes,
    )


@dataclass
class SingleTurnFactory:
    """Picklable factory: one SingleTurnEnv per row (the reward fn must be module-level)."""

    reward_fn: RewardFn
    renderer: PromptRenderer

    def __call__(self, example: dict[str, Any]) -> SingleTurnEnv:
        return SingleTurnEnv(example, self.reward_fn, self.renderer)
