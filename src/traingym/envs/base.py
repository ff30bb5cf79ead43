"""The environment seam. An Env is single-use and async: one episode, then discarded.

An EnvFactory builds an Env for one dataset row; factories must be picklable so that envs can
be built wherever the rollout runs (another process, a Ray actor).

Multi-turn: `step` returns `done=False` and a next observation whose ids are the context so far
(prompt + completions + earlier environment tokens) followed by the environment's new tokens;
the runner checks this prefix property and raises ContextError otherwise (envs/transcript.py).

A StepResult (types.py) carries the reward, `done`, the next observation, `info` (JSON-safe
details for samples.jsonl's env_info) and `drop`: a reason string when the episode's reward is
unknown and the sample must be neither trained on nor counted (Sample.drop_reason; e.g. a judge
that failed under on_failure='drop'), else None.
Helpers: envs/single_turn.py (a reward function), envs/multi_turn.py (chat replies),
envs/tools.py (tool calls).

An env that holds something for its episode (a server session, a task) may also define
`close(self)` (async, or a plain function): the runner calls it once when the collection its
episode belongs to ends, however it ended (done, max_turns, max_context_tokens, or another
episode's error: the other episodes' env calls are cancelled first), so the session is freed
then rather than when the object is garbage-collected. It must be safe to call after the env
released things itself (a session the server already closed). A close that raises or takes
over a minute is reported as a warning.
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
