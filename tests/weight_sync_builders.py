"""Config for weight sync, and the two builders the loop and the engine call.

    cfg = WeightSyncConfig(codec="auto", transport=TcpConfig(port=29600))
    pub = make_publisher(cfg)              # trainer: pub.publish(trainer.export(), step + 1)
    sub = make_subscriber(cfg, engine_state)   # engine: sub.poll(timeout); sub.state

The transport config's `type` names its entry in the transport registry (registry.py).
Not covered: a tcp sender's picked port (pass a fixed port, or read TcpSender.port).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traingym.weights import registry
from traingym.weights.base import State
from traingym.weights.inproc import InprocConfig
from traingym.weights.sync import (Publisher, PublisherConfig, Subscriber, SubscriberConfig)


@dataclass(frozen=True)
class WeightSyncConfig:
    codec: str = "auto"
    """"delta", "full" or "auto" (delta unless a full send is predicted faster)."""
    anchor_budget: float = 1.0
    """Anchor once delta bytes since the last anchor would pass this x the full size."""
    zstd_level: int = 1
    verify_base: bool = False
    """Receivers re-hash their weights before applying each delta (two passes over the state
    per delta); off, they verify from the changes alone plus the periodic full check
    (sync.py)."""
    transport: Any = field(default_factory=InprocConfig)
    """A transport's config (InprocConfig, TcpConfig ...); its `type` is the registry name."""
    threads: int = 1
    """Threads the delta codec codes and applies with, each its own shard of the state."""


def make_publisher(cfg: WeightSyncConfig) -> Publisher:
    sender = registry.get(cfg.transport.type).sender(cfg.transport)
    return Publisher(sender, PublisherConfig(cfg.codec, cfg.anchor_budget, cfg.zstd_level,
                                             threads=cfg.threads))


def make_subscriber(cfg: WeightSyncConfig, state: State | None = None) -> Subscriber:
    receiver = registry.get(cfg.transport.type).receiver(cfg.transport)
    return Subscriber(receiver, SubscriberConfig(verify_base=cfg.verify_base,
                                                 threads=cfg.threads), state)
