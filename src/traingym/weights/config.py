"""Config for weight sync, and the two builders the loop and the engine call.

    cfg = WeightSyncConfig(codec="auto", transport=TcpConfig(port=29600))
    pub = make_publisher(cfg)              # trainer: pub.publish(trainer.export(), step + 1)
    sub = make_subscriber(cfg, engine_state)   # engine: sub.poll(timeout); sub.state
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traingym.weights import dist, filesystem, inproc, tcp  # noqa: F401 - fill the registry
from traingym.weights.base import RECEIVERS, SENDERS, State
from traingym.weights.dist import DistConfig
from traingym.weights.filesystem import FilesystemConfig, ShmConfig
from traingym.weights.inproc import InprocConfig
from traingym.weights.sync import (Publisher, PublisherConfig, Subscriber, SubscriberConfig)
from traingym.weights.tcp import TcpConfig

TransportConfig = InprocConfig | ShmConfig | TcpConfig | FilesystemConfig | DistConfig


@dataclass(frozen=True)
class WeightSyncConfig:
    codec: str = "auto"
    """"delta", "full" or "auto" (delta unless a full send is predicted faster)."""
    anchor_budget: float = 1.0
    """Anchor once delta bytes since the last anchor would pass this x the full size."""
    zstd_level: int = 1
    verify_base: bool = True
    """Receivers re-hash their weights before applying a delta."""
    transport: TransportConfig = field(default_factory=InprocConfig)


def make_publisher(cfg: WeightSyncConfig) -> Publisher:
    sender = SENDERS[cfg.transport.type](cfg.transport)
    return Publisher(sender, PublisherConfig(cfg.codec, cfg.anchor_budget, cfg.zstd_level))


def make_subscriber(cfg: WeightSyncConfig, state: State | None = None) -> Subscriber:
    receiver = RECEIVERS[cfg.transport.type](cfg.transport)
    return Subscriber(receiver, SubscriberConfig(verify_base=cfg.verify_base), state)
