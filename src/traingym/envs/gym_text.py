"""Gymnasium text environments as traingym multi-turn envs.

A `gymnasium.Env` with `spaces.Text` observation and action spaces plays a chat: `reset()`'s
observation is the first user message, each policy turn is an action, step rewards sum, and
`terminated`/`truncated` or rollout.max_turns ends the episode. `task.env = "gym:<id>"` (or
'gym:module:Id-v0' to import the registering module first); a row's 'seed' and 'options' go to
`env.reset`. Needs `traingym[gym]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from traingym.envs.multi_turn import MultiTurnEnv, Reply
from traingym.envs.render import PromptRenderer


def _gymnasium():
    try:
        import gymnasium
    except ModuleNotFoundError:
        raise ModuleNotFoundError("task.env = 'gym:...' needs gymnasium: pip install "
                                  "'traingym[gym]'") from None
    return gymnasium


def make_text_env(env_id: str, kwargs: dict[str, Any] | None = None):
    """`gymnasium.make(env_id)`, checked to have Text observations and actions."""
    gym = _gymnasium()
    try:
        env = gym.make(env_id, **(kwargs or {}))
    except gym.error.Error as e:
        raise ValueError(f"task.env 'gym:{env_id}': gymnasium cannot make it ({e}); register "
                         "the env, or name its module as 'gym:module:Id-v0' so gymnasium "
                         "imports it") from e
    for what in ("observation_space", "action_space"):
        space = getattr(env, what)
        if not isinstance(space, gym.spaces.Text):
            env.close()
            raise ValueError(f"task.env 'gym:{env_id}': its {what} is {space!r}, not "
                             "gymnasium.spaces.Text; only text environments can talk with a "
                             "language model (wrap it to turn its observations and actions "
                             "into text)")
    return env


class GymTextEnv(MultiTurnEnv):
    """One episode of a Gymnasium text env (module docstring)."""

    def __init__(self, example: dict[str, Any], renderer: PromptRenderer, env_id: str,
                 kwargs: dict[str, Any] | None = None):
        super().__init__(example, renderer)
        self.env_id, self.kwargs = env_id, kwargs or {}
        self.env = None

    def first_messages(self) -> list[dict[str, Any]]:
        self.env = make_text_env(self.env_id, self.kwargs)
        obs, _info = self.env.reset(seed=self.example.get("seed"),
                                    options=self.example.get("options"))
        obs = self._text(obs, "reset()")
        prompt = self.example.get("prompt")
        content = f"{prompt}\n\n{obs}" if isinstance(prompt, str) and prompt else obs
        return self.renderer.messages({"prompt": content})

    async def respond(self, text: str) -> Reply:
        obs, reward, terminated, truncated, _info = self.env.step(text)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) \
                or not math.isfinite(reward):
            raise ValueError(f"gym env {self.env_id!r}: step() returned reward {reward!r}; it "
                             "must be a finite number")
        if terminated or truncated:
            self.env.close()
            return Reply(reward=float(reward), done=True)
        return Reply([{"role": "user", "content": self._text(obs, "step()")}], float(reward))

    def _text(self, obs: Any, where: str) -> str:
        if not isinstance(obs, str):
            raise ValueError(f"gym env {self.env_id!r}: {where} returned observation "
                             f"{obs!r:.80}, not a str")
        return obs


@dataclass
class GymMaker:
    """Picklable env maker `(example, renderer) -> GymTextEnv` for one gymnasium id."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    env_adapter = "gym"  # its record in envs/adapters.py (not a field)

    def __call__(self, example: dict[str, Any], renderer: PromptRenderer) -> GymTextEnv:
        return GymTextEnv(example, renderer, self.env_id, self.kwargs)
