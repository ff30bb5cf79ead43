"""The running token context of one episode, kept as ids and only ever appended to.

The context is the first prompt, then each turn's policy tokens (as the engine sampled them)
and the environment's tokens (its next observation minus the context it extends). Each token
of the completion segment is marked for the loss: 1 for the policy's, 0 for the
environment's. Nothing is decoded and re-encoded on the way, so what the trainer sees is what
the engine was conditioned on, id for id.

Covered: strict-prefix checks with the first mismatching position in the error.
Not covered: contexts that rewrite history (summarising or dropping earlier turns); such an
env must start a new episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from traingym.core.types import ENV_VERSION, Completion, Sample


class ContextError(ValueError):
    """An observation or completion that does not extend the episode's context."""


def _first_mismatch(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


@dataclass
class Transcript:
    prompt_ids: tuple[int, ...]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 policy, 0 environment
    logprobs: list[float] = field(default_factory=list)  # 0.0 at environment tokens
    versions: list[int] = field(default_factory=list)  # ENV_VERSION at environment tokens
    turns: int = 0  # policy turns so far
    routes: Any = None  # the latest turn's Completion.routes: they cover the whole context

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def context(self) -> tuple[int, ...]:
        return self.prompt_ids + tuple(self.completion_ids)

    def add_policy(self, completion: Completion) -> None:
        """Append one turn of policy tokens; the completion must continue this very context.
        An empty turn counts only when the model stopped at once (finish "stop"): a server
        speaking the plain OpenAI API does not report the stop token it ended on."""
        if tuple(completion.prompt_ids) != self.context:
            at = _first_mismatch(completion.prompt_ids, self.context)
            raise ContextError(f"completion was sampled from a different context (first "
                               f"difference at token {at} of {len(self)})")
        if not completion.token_ids and completion.finish_reason != "stop":
            raise ContextError(f"a policy turn with no tokens that did not stop (finish "
                               f"{completion.finish_reason!r}): the engine returned nothing")
        self.completion_ids += completion.token_ids
        self.loss_mask += [1] * len(completion.token_ids)
        self.logprobs += completion.logprobs
        self.versions += (completion.token_versions
                          or [completion.version] * len(completion.token_ids))
        self.turns += 1
        self.routes = completion.routes

    def env_tokens(self, observation_ids: Sequence[int]) -> list[int]:
        """The ids an observation appends to the context; it must extend it strictly."""
        n = len(self)
        if len(observation_ids) <= n or tuple(observation_ids[:n]) != self.context:
            at = _first_mismatch(observation_ids, self.context)
            raise ContextError(
                f"the next observation ({len(observation_ids)} tokens) must be the current "
                f"context ({n} tokens: prompt + completions + environment tokens so far) "
                f"followed by at least one new token; it differs at token {at}. Append the "
                "environment's reply as token ids; never re-tokenize the conversation.")
        return list(observation_ids[n:])

    def add_env(self, ids: Sequence[int]) -> None:
        self.completion_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [ENV_VERSION] * len(ids)

    def last_turn(self) -> list[int]:
        """The ids of the policy's latest turn (the trailing run of policy tokens)."""
        start = len(self.loss_mask)
        while start > 0 and self.loss_mask[start - 1] == 1:
            start -= 1
        return self.completion_ids[start:]

    def to_sample(self, example: dict[str, Any], tokenizer, prompt_text: str,
                  finish_reason: str, reward: float = 0.0) -> Sample:
        return Sample(
            prompt_ids=self.prompt_ids,
            completion_ids=list(self.completion_ids),
            completion_logprobs=list(self.logprobs),
            versions=list(self.versions),
            example=example,
            prompt_text=prompt_text,
            completion_text=tokenizer.decode(self.completion_ids, skip_special_tokens=True),
            finish_reason=finish_reason,
            reward=reward,
            loss_mask=list(self.loss_mask),
            turns=self.turns,
            final_text=tokenizer.decode(self.last_turn(), skip_special_tokens=True),
            routes=self.routes,
        )
