"""The `weights` config section."""

from __future__ import annotations

from pydantic import Field, field_validator

from traingym.core.errors import Strict, did_you_mean
from traingym.weights import registry


class WeightsConfig(Strict):
    """How the trainer's weights reach the engines after each step: the colocated engine in
    sync mode (weights/colocated.py), engine processes or Ray actors in async mode
    (cluster/local.py, cluster/ray.py)."""

    codec: str = Field("auto", description="'delta' (only what changed, against the engine's "
                       "version), 'full' (every byte), or 'auto' (delta unless full is "
                       "predicted faster from measured rates)")
    transport: str = Field("inproc", description="'inproc' (in memory), 'shm' (/dev/shm), "
                           "'tcp' (sockets) or 'filesystem' (<run dir>/weights), or a "
                           "'module:ATTR' path to a transport record (weights/registry.py); "
                           "'dist' is registered but not selectable in the loop yet")
    anchor_budget: float = Field(1.0, gt=0, description="send a full update (an anchor) once "
                                 "the delta bytes since the last one would pass this x full size")
    timeout_s: float = Field(120.0, gt=0, description="the engine waits at most this long for "
                             "each published version (tcp: also per send), then the run fails")
    dead_after_s: float = Field(10.0, gt=0, description="tcp, shm, filesystem: a sender silent "
                                "this long counts as dead")
    threads: int = Field(1, ge=1, le=64, description="threads the delta codec codes with on the "
                         "trainer and applies with on each engine, each its own shard of the "
                         "state (2 on 2 cores: a 1 GB delta over tcp 1.8x faster, "
                         "BENCHMARKS.md, End to end over TCP)")

    @field_validator("codec")
    @classmethod
    def _known_codec(cls, v: str) -> str:
        from traingym.weights.base import CODECS  # heavy: numpy, torch

        choices = ["auto", *CODECS.names()]
        if v == "auto":
            return v
        if v not in choices and ":" not in v:
            raise ValueError(f"unknown codec {v!r}; choose one of {choices} or give a "
                             f"'module:Class' path{did_you_mean(v, choices)}")
        codec = CODECS.get(v)  # a path that does not load: a RegistryError (ValueError)
        if v not in ("delta", "full") and getattr(codec, "delta", False):
            raise ValueError(f"weights.codec={v!r} is a delta codec: only the built-in "
                             "'delta' is covered; a codec of your own is a full one")
        return v

    @field_validator("transport")
    @classmethod
    def _known_transport(cls, v: str) -> str:
        transport = registry.get(v)  # UnknownTransport (a ValueError) names the choices
        if transport.not_in_loop:
            raise ValueError(f"weights.transport={v!r} cannot be selected in the training loop:"
                             f" {transport.not_in_loop}; choose one of "
                             f"{registry.loop_choices()}")
        return v
