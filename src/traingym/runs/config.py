"""The `checkpoint` config section."""

from __future__ import annotations

from pydantic import Field

from traingym.core.errors import Strict


class CheckpointConfig(Strict):
    every: int = Field(0, ge=0, description="save every N steps (0: only the last step)")
    keep: int = Field(2, ge=1, description="how many checkpoints to keep")
