"""The rollout-engine seam: sample completions with log-probs; take verified weights.

Every engine (rollout/registry.py: torch, vllm, sglang, openai, or a 'module:Class' path) implements
`RolloutEngine`; every caller builds engines through `registry.build` and uses only what is declared
here (contracts: the method docstrings). Optional, outside the protocol:
- `writable_state() -> dict[str, Tensor]`: the engine's own tensors, named as the wire sends
  them, for a same-process subscriber to apply into in place (weights/colocated.py);
  `update_weights` then gets those tensors already written and verified.
- `async score(prompts, completions, temperature) -> list[list[float]]` (with
  `abilities.scores_tokens`): per row, the log-prob of each completion token given the prompt
  and the tokens before it, under softmax(logits / T) (T <= 0: softmax(logits)), sampling
  nothing; distillation teachers use it. A T other than 1 (or <= 0) raises ValueError
  without `abilities.scores_at_any_temperature`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from traingym.core.types import Completion, GenerationRequest

UNSERVED = -1  # `version` of an engine holding weights no trainer published (never served)


@dataclass(frozen=True)
class EngineAbilities:
    takes_weights: bool = True
    """`update_weights` works (False: a read-only endpoint, for evaluation, judges and
    teachers; the training loop refuses it)."""
    inflight_updates: bool = False
    """Calls `between_steps` before every decode step, so weights may change mid-completion
    (async.inflight_updates needs it)."""
    crosses_processes: bool = False
    """Can be built inside an async engine process or a Ray actor (from the config alone)."""
    step_decoding: bool = False
    """Has `step_decoder(max_rows=None)`, a rollout/continuous.py StepDecoder (admit / step /
    retire rows between decode steps): `traingym serve` batches continuously on it. Engines
    without it get whole `generate` calls (serve/batching.py). Read it on the engine object:
    the built-in engine sets it per instance (True where its fused decode path runs)."""
    scores_tokens: bool = False
    """Has `score(prompts, completions, temperature)`: log-probs of given tokens (module
    docstring); a distillation teacher needs it (distill.teacher_engine)."""
    scores_at_any_temperature: bool = False
    """`score` applies 1 / T exactly at any T; False: only T = 1 (or T <= 0)."""
    reports_routes: bool = False
    """On a mixture-of-experts model (models/moe.py), each Completion carries the experts every
    position was routed to (`Completion.routes`); algorithm.routing_replay needs it."""


class EngineUnavailable(RuntimeError):
    """The engine cannot serve (its server died, never started, or is unreachable); the
    message names the engine, what failed and what to do."""


class RolloutEngine(Protocol):
    version: int  # policy version of the weights it serves (UNSERVED: none published yet)
    abilities: EngineAbilities
    between_steps: Callable[[], None] | None  # used only with abilities.inflight_updates

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """Return, for each request, its `n` completions: token ids in and out, never text; each
        token's log-prob under softmax(logits / T) before any top-k/top-p cut (greedy:
        softmax(logits)), as the trainer recomputes it, and the policy version that produced it
        (`Completion.version`; `token_versions` where weights changed mid-decode)."""
        ...

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Serve `state` as policy `version` once this returns. `state` is the full state the weight
        subscriber verified against the trainer's hash (weights/sync.py), in the engine's dtype,
        named as in the HF model's `state_dict()` (a tied tensor possibly once:
        colocated.wire_state), so an engine never applies bytes that did not match the hash."""
        ...

    def state_hash(self) -> str:
        """weights/hashing.state_hash of the weights it serves, read back from the engine
        where it can be (the built-in engine: its model); an engine that cannot read its
        weights back says in its docstring what it hashes instead."""
        ...

    def health(self) -> dict:
        """{'ok': bool, ...details}; cheap enough to call between steps."""
        ...

    def close(self) -> None:
        """Release the engine (its server process, threads, memory); idempotent."""
        ...
