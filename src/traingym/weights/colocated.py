"""In-process weight sync for colocated runs: the trainer's state is copied into the engine's
model (cast to the engine's dtype) between steps. No codec or transport is involved; the
subsystem for other processes and machines lives beside this file.
"""

from __future__ import annotations

import torch


class ColocatedSync:
    def __init__(self, engine):
        self.engine = engine

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.engine.update_weights(state, version)
