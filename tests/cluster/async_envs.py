"""Env makers for the async tests; module-level so engine processes (spawn) can import them."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from traingym.envs.multi_turn import MultiTurnEnv, Reply
from traingym.envs.single_turn import SingleTurnEnv
from traingym.envs.tasks import digit_fraction

_seen: Counter = Counter()  # per engine process: uses of each prompt
_steps = Counter()


class _Wrapped:
    def __init__(self, inner, before_step):
        self.inner, self.before_step = inner, before_step

    async def reset(self):
        return await self.inner.reset()

    async def step(self, completion):
        await self.before_step()
        return await self.inner.step(completion)


@dataclass
class SlowFirst:
    """Rows with 'slow': True wait `delay_s` on their first group (G uses) in a process."""

    group_size: int
    delay_s: float

    def __call__(self, example, renderer):
        first = _seen[example["prompt"]] < self.group_size
        _seen[example["prompt"]] += 1
        delay = self.delay_s if example.get("slow") and first else 0.0
        return _Wrapped(SingleTurnEnv(example, digit_fraction, renderer),
                        lambda: asyncio.sleep(delay))


@dataclass
class KillOnce:
    """SIGKILLs its own (engine) process at the `after`-th env step, unless `marker` exists
    (it creates it first, so a restarted engine runs on)."""

    marker: str
    after: int

    def __call__(self, example, renderer):
        async def maybe_die():
            _steps["n"] += 1
            if _steps["n"] == self.after and not Path(self.marker).exists():
                Path(self.marker).write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)

        return _Wrapped(SingleTurnEnv(example, digit_fraction, renderer), maybe_die)


def raising_reward(sample):
    raise ValueError("reward exploded on purpose")


class AskAgain(MultiTurnEnv):
    """Multi-turn: 50 ms after every turn the user says 'Again.'; rewards digits (a module-level
    class, so it is its own picklable env maker)."""

    async def respond(self, text):
        await asyncio.sleep(0.05)  # episodes outlast a train step, so some span an update
        return Reply(messages=[{"role": "user", "content": "Again."}],
                     reward=sum(c.isdigit() for c in text) / max(len(text), 1))
