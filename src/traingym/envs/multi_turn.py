"""Multi-turn chat environments: the environment answers, the policy continues.

Subclass MultiTurnEnv and write `async def respond(self, text: str) -> Reply`: it gets the text
of the policy's latest turn and returns the messages the environment says next (user or tool
messages) with this step's reward, or `done=True` with the last one. The base class keeps the
episode as token ids (envs/transcript.py): the first prompt is rendered with the chat template;
each reply is rendered with the chat template as a continuation (envs/render.py) and its ids
are appended, so the policy's sampled tokens are never decoded and re-encoded into the
context. A policy turn cut at max_new_tokens is closed by the environment: the end-of-turn
token is then an environment token (masked out of the loss).

The run builds envs with a maker `(example, renderer) -> Env` (a class like the ones here, or
a module-level function); BoundFactory pairs it with the run's renderer into a picklable
EnvFactory.

Covered: chat templates that render each message independently of the later ones (ChatML:
SmolLM2, Qwen2/2.5, the tiny test model). Not covered: templates that rewrite earlier turns
(Qwen3 dropping old <think> blocks): the context keeps what the policy wrote, by design, so it
then differs from a full re-render. Environment text containing special-token strings is
encoded as those special tokens.
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
