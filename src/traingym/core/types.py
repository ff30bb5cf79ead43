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
    top_logprobs: int = 0  # > 0: also return the k most likely tokens per step (serving)


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
    version: int  # policy version that produced the first token (the oldest)
    token_versions: list[int] | None = None  # per token, where weights changed mid-decode
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per token, the `params.top_logprobs` most likely (token id, log-prob) pairs under the
    same distribution as `logprobs`, most likely first; None when not asked for."""
    routes: Any = None
    """Mixture-of-experts models, engines with `abilities.reports_routes`: the experts each
    position was routed to, a numpy integer array (positions, MoE layers, k) over
    prompt_ids + token_ids[:-1] (every position the engine ran forward; models/moe.py); else
    None."""


@dataclass
class Observation:
    """What an environment shows the policy: the whole context as token ids, and text for logs.

    A later observation of a multi-turn episode must be the previous context, the policy's
    completion and at least one new (environment) token, in that order; its text is the new
    part only."""

    prompt_ids: tuple[int, ...]
    text: str = ""


@dataclass
class StepResult:
    """An environment's answer to a completion. `drop`: why the episode's reward is unknown
    (a judge that failed under on_failure='drop', envs/judge.py), else None: the sample is then
    neither trained on (its group is left out of the batch) nor counted in evaluation, and
    `reward` is a placeholder nobody reads (Sample.drop_reason)."""

    reward: float
    done: bool = True
    next_observation: Observation | None = None
    info: dict[str, Any] = field(default_factory=dict)
    drop: str | None = None


ENV_VERSION = -1  # the `versions` entry of a token the environment wrote, not the policy


@dataclass
class Sample:
    """One scored episode; the unit a reward function sees and the trainer learns from.

    `completion_ids` is everything after the first prompt: in a multi-turn episode the policy's
    tokens and the environment's tokens, interleaved, exactly as the engine saw them.
    `loss_mask` marks each of them: 1 for a policy token (trained on), 0 for an environment
    token (masked out of the loss). Environment tokens carry log-prob 0.0 and version
    ENV_VERSION. None (the default) means every token is the policy's (single-turn).
    """

    prompt_ids: tuple[int, ...]
    completion_ids: list[int]
    completion_logprobs: list[float]  # engine's log-probs, one per completion token
    versions: list[int]  # policy version per completion token (ENV_VERSION: env token)
    example: dict[str, Any]  # the dataset row this sample answers
    prompt_text: str = ""
    completion_text: str = ""
    finish_reason: str = "length"  # "stop" | "length" | "max_turns" | "max_context"
    reward: float = 0.0
    loss_mask: list[int] | None = None  # 1 policy token, 0 environment token
    turns: int = 1  # policy turns in the episode
    final_text: str = ""  # the policy's last turn, decoded (single-turn: the completion)
    env_info: list[dict[str, Any]] = field(default_factory=list)
    """Per environment step that reported any, the JSON-safe part of its StepResult.info (a
    code env's sandbox verdict); for logs (samples.jsonl), never for the loss."""
    drop_reason: str | None = None
    """Why this sample must be neither trained on nor counted (an env step's StepResult.drop),
    else None; its `reward` is then a placeholder: left out of step means, group rewards
    (envs/group.py), the batch (algorithms/base.py) and evaluation (evaluate.py)."""
    routes: Any = None
    """Mixture-of-experts models: the experts the engine routed each position of prompt_ids +
    completion_ids to, a numpy integer array (positions, MoE layers, k) covering a prefix of
    them (single-turn: all but the last token; models/moe.py); None where the engine reports
    no routes. The trainer replays it (algorithm.routing_replay) or measures against it
    (`moe_route_mismatch`); never written to samples.jsonl."""

    def __post_init__(self):
        if self.loss_mask is None:
            self.loss_mask = [1] * len(self.completion_ids)
        n = len(self.completion_ids)
        lengths = (len(self.completion_logprobs), len(self.versions), len(self.loss_mask))
        if lengths != (n, n, n):
            raise ValueError(f"Sample: {n} completion ids but (logprobs, versions, loss_mask) "
                             f"lengths {lengths}; all must match")
        if self.routes is not None and len(self.routes) > len(self.prompt_ids) + n:
            raise ValueError(f"Sample: routes for {len(self.routes)} positions but only "
                             f"{len(self.prompt_ids) + n} prompt and completion tokens")


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
