"""A small Gymnasium text environment, written against gymnasium's own API: guess a number.

Importing this module registers `traingym/GuessNumber-v0` (at most 4 guesses); use it as
`task.env = "gym:traingym.envs.gym_guess:traingym/GuessNumber-v0"`. Reward: 1.0 for the right
guess (the episode then ends), else 0.0 with a hint ("Higher." / "Lower."). Used by the tests
and as the example in docs/environments.md.
"""

from __future__ import annotations

import re
import string

import gymnasium as gym
from gymnasium import spaces

_INT = re.compile(r"-?\d+")


class GuessNumber(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, low: int = 1, high: int = 10):
        self.low, self.high = low, high
        self.observation_space = spaces.Text(max_length=200, charset=string.printable)
        self.action_space = spaces.Text(max_length=10_000, charset=string.printable)
        self.target = low

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(self.low, self.high + 1))
        return (f"I am thinking of a number from {self.low} to {self.high}. Guess it: answer "
                "with one number."), {}

    def step(self, action: str):
        m = _INT.search(action)
        if m is None:
            return f"Answer with one number from {self.low} to {self.high}.", 0.0, False, False, {}
        guess = int(m.group())
        if guess == self.target:
            return "Right.", 1.0, True, False, {"guess": guess}
        hint = "Higher." if guess < self.target else "Lower."
        return hint, 0.0, False, False, {"guess": guess}


gym.register(id="traingym/GuessNumber-v0", entry_point=GuessNumber, max_episode_steps=4)
