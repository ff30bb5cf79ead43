"""Multi-turn chat environments: the environment answers, the policy continues.

Subclass MultiTurnEnv and write `async def respond(self, text) -> Reply` (the next user or tool
messages, the step's reward, or done). The episode is kept as token ids (envs/transcript.py):
each reply is rendered as a continuation (envs/render.py) and appended, so the policy's tokens
are never decoded and re-encoded. A turn cut at max_new_tokens is closed by an environment
end-of-turn token (masked out of the loss). BoundFactory pairs a maker with the run's renderer.
Covered: templates that render each message independently of later ones (ChatML).
Not covered: templates that rewrite earlier turns (Qwen3 dropping old <think>); the context
keeps what the policy wrote, by design. Special-token strings in env text encode as specials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from traingym.core.types import Completion, Observation, Sample, StepResult
from traingym.envs.base import Env
from traingym.envs.render import PromptRenderer
from traingym.envs.transcript import Transcript

EnvMaker = Callable[[dict[str, Any], PromptRenderer], Env]


@dataclass
class Reply:
    """What the environment says after a policy turn."""

    messages: list[dict[str, Any]] = field(default_factory=list)  # chat messages to append
    reward: float = 0.0  # this step's reward; the episode's reward is the sum
    done: bool = False


class MultiTurnEnv:
    """Base class: one episode of a chat between the policy and `respond`."""

    def __init__(self, example: dict[str, Any], renderer: PromptRenderer):
        self.example, self.renderer = example, renderer
        self.transcript: Transcript | None = None
        self._prompt_text = ""
        self._done = False

    def first_messages(self) -> list[dict[str, Any]]:
        """The opening conversation; by default the row's prompt (see PromptRenderer)."""
        return self.renderer.messages(self.example)

    def tool_schemas(self) -> list[dict] | None:
        """JSON schemas given to the chat template as `tools=`; None for no tools."""
        return None

    async def respond(self, text: str) -> Reply:
        raise NotImplementedError("a MultiTurnEnv subclass writes respond()")

    def sample(self, finish_reason: str = "stop") -> Sample:
        """The episode so far as a Sample (for reward functions over typed records)."""
        return self.transcript.to_sample(self.example, self.renderer.tokenizer,
                                         self._prompt_text, finish_reason)

    async def reset(self) -> Observation:
        if self.transcript is not None:
            raise RuntimeError(f"{type(self).__name__} is single-use: reset() once")
        self._prompt_text = self.renderer.render(self.first_messages(), self.tool_schemas())
        self.transcript = Transcript(self.renderer.encode(self._prompt_text))
        return Observation(self.transcript.prompt_ids, self._prompt_text)

    async def step(self, completion: Completion) -> StepResult:
        if self.transcript is None or self._done:
            raise RuntimeError(f"{type(self).__name__} is single-use: reset() once, then step() "
                               "until done")
        self.transcript.add_policy(completion)
        tok = self.renderer.tokenizer
        reply = await self.respond(tok.decode(completion.token_ids, skip_special_tokens=True))
        if reply.done:
            self._done = True
            return StepResult(reply.reward, done=True)
        if not reply.messages:
            raise ValueError(f"{type(self).__name__}.respond returned neither messages nor "
                             "done=True")
        stop_text = (tok.decode(completion.token_ids[-1:]) if completion.finish_reason == "stop"
                     else None)
        text = self.renderer.continuation(reply.messages, stop_text)
        self.transcript.add_env(self.renderer.encode(text))
        return StepResult(reply.reward, done=False,
                          next_observation=Observation(self.transcript.context, text))


@dataclass
class BoundFactory:
    """EnvFactory from an env maker and the run's renderer; picklable when the maker is (a
    module-level class or function, or a dataclass of picklable fields)."""

    make: EnvMaker
    renderer: PromptRenderer

    def __call__(self, example: dict[str, Any]) -> Env:
        return self.make(example, self.renderer)
