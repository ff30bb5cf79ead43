"""The env factory of a run, built one way by the run, its engine processes and evaluation:
the user's env (built per episode from (example, renderer)) bound to the prompt renderer, or
the single-turn env over a reward function."""

from __future__ import annotations

from typing import Callable

from traingym.envs.base import EnvFactory
from traingym.envs.multi_turn import BoundFactory
from traingym.envs.render import PromptRenderer
from traingym.envs.single_turn import SingleTurnFactory


def episode_factory(tokenizer, prefill: str, system_prompt: str | None, env: Callable | None,
                    reward_fn: Callable | None) -> EnvFactory:
    renderer = PromptRenderer(tokenizer, prefill, system_prompt)
    if env is not None:
        return BoundFactory(env, renderer)
    return SingleTurnFactory(reward_fn, renderer)
