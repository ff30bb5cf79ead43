"""The trainer seam: one optimizer step per batch; export weights; the model and optimizer
that runs/checkpoint.py saves and restores.
"""

from __future__ import annotations

from typing import Protocol

import torch

from traingym.core.types import Batch


class Trainer(Protocol):
    def train_step(self, batch: Batch) -> dict[str, float]: ...

    def export(self) -> dict[str, torch.Tensor]:
        """The current weights, detached, for the rollout engines."""
        ...

    # what runs/checkpoint.py saves and loads: the full model and an optimizer keyed like it
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def close(self) -> None:
        """Release what the trainer holds (data-parallel ranks); idempotent."""
        ...
