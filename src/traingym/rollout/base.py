"""The rollout-engine seam: sample completions with log-probs; take verified weights.

Every engine (rollout/registry.py: torch, vllm, sglang, openai, or a 'module:Class' path)
implements `RolloutEngine`, and every caller (the sync loop, async engine processes, Ray
actors, evaluation, serving) builds engines through `registry.build` and uses only
what is declared here.

Contract of `generate`: token ids in, token ids out, never text; each completion carries the
log-prob of each of its tokens under the sampling distribution softmax(logits / T) before any
top-k / top-p cut (greedy: softmax(logits)), which is what the trainer recomputes, and the
policy version that produced its tokens (`Completion.version`, and `token_versions` where
the weights changed mid-decode).

Contract of `update_weights`: `state` is the full state the weight subscriber verified
against the trainer's hash (weights/sync.py), in the engine's dtype, names as in the Hugging
Face model's `state_dict()` (a tied tensor may appear once, under its first name in sorted
order: weights/colocated.py wire_state). The engine serves exactly those weights as policy
`version` once it returns. Delta decoding and verification happen before the engine sees
anything, so an engine never applies bytes that did not match the hash.
Optional (not in the protocol below): `writable_state() -> dict[str, Tensor]`, the engine's own
tensors named as the wire sends them, for a subscriber in the same process to apply updates
into in place (weights/colocated.py; the built-in engine has it). `update_weights` then gets
those same tensors, already written and verified, and only starts serving them.

Contract of `async score(prompts, completions, temperature) -> list[list[float]]` (only engines
with `abilities.scores_tokens`; not in the protocol below): for each row, the log-prob
of each token of `completions[i]` given `prompts[i]` and the completion tokens before it,
under softmax(logits / T) (T <= 0: softmax(logits)), the convention of `generate` and of the
trainer; nothing is sampled. A teacher for on-policy distillation (algorithms/distill.py)
scores the student's samples with it. An engine without `scores_at_any_temperature` scores
only at T = 1 (and T <= 0) and raises ValueError at any other T.
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


class EngineUnavailable(RuntimeError):
    """The engine cannot serve (its server died, never started, or is unreachable); the
    message names the engine, what failed and what to do."""


class RolloutEngine(Protocol):
    version: int  # policy version of the weights it serves (UNSERVED: none published yet)
    abilities: EngineAbilities
    between_steps: Callable[[], None] | None  # used only with abilities.inflight_updates

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """Return, for each request, its `n` completions."""
        ...

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Serve `state` (full, verified; see the module docstring) as policy `version`."""
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
