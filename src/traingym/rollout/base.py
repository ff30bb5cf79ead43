"""The rollout-engine seam: sample completions with log-probs; take new weights."""

from __future__ import annotations

from typing import Protocol

import torch

from traingym.types import Completion, GenerationRequest


class RolloutEngine(Protocol):
    version: int  # policy version of the weights the engine serves

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """Return, for each request, its `n` completions."""
        ...

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Serve `state` (a full, verified state dict) as policy `version` from now on."""
        ...
