"""Typed records that cross traingym's seams.

Tokens travel as ids from engine to environment to trainer; nothing is re-tokenized on the way.
Each sample records the policy version that produced its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """Sample `n` completions of one prompt. `seed` makes the n samples reproducible."""

    prompt_ids: tuple[int, ...]
    n: int = 1
    params: SamplingParams = SamplingParams()
    seed: int = 0


@dataclass
class Completion:
    """One sampled continuation, with the log-probability of each token under the sampling
    distribution (logits / temperature; the raw logits when greedy)."""

    prompt_ids: tuple[int, ...]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token, included in token_ids) or "length"
    version: int  # policy version that produced the tokens


@dataclass
class Observation:
    """What an environment shows the policy: the prompt as token ids (and its text for logs)."""

    prompt_ids: tuple[int, ...]
    text: str = ""


@dataclass
class StepResult:
    """An environment's answer to a completion."""

    reward: float
    done: bool = True
    next_observation: Observation | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    """One scored completion; the unit a reward function sees and the trainer learns from."""

    prompt_ids: tuple[int, ...]
    completion_ids: list[int]
    completion_logprobs: list[float]  # engine's log-probs, one per completion token
    versions: list[int]  # policy version per completion token
    example: dict[str, Any]  # the dataset row this sample answers
    prompt_text: str = ""
    completion_text: str = ""
    finish_reason: str = "length"
    reward: float = 0.0


@dataclass
class Group:
    """The G samples drawn for one prompt; advantages are relative within it."""

    samples: list[Sample]
    index: int  # position of the prompt in the training stream


@dataclass
class Batch:
    """What the trainer consumes: groups with per-sample advantages (kept groups only)."""

    groups: list[Group]
    advantages_G: list[list[float]]  # one list per group, one value per sample
    num_dropped_groups: int = 0
