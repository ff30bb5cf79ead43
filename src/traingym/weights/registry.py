"""The weight-sync transports, one `Registry` (core/registry.py): each declares itself in its file.

A transport is one file with a `TRANSPORT = Transport(...)` record (name, config from the run's
`weights` section, sender and receiver classes, abilities) plus one entry in `TRANSPORTS`: name ->
"module:ATTR", imported on first use. `weights.transport` is a name here or a "module:ATTR" path
(checked when the config is built).
Readers select by ability: the colocated loop (colocated.py) any with empty `not_in_loop`; async
mode (cluster/local.py, engine_process.py) those that cross processes, pickling the receiver class
and config, reconnecting only where the transport `reconnects`; Ray (cluster/ray.py) those that
cross nodes.
Not covered: choosing a transport per engine (one transport per run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from traingym.core.registry import Registry, RegistryError


@dataclass(frozen=True)
class Abilities:
    crosses_processes: bool
    """Receivers may live in other processes of this machine (required by mode='async')."""
    crosses_nodes: bool
    """Receivers may live on other machines (required by cluster.type='ray')."""
    reconnects: bool = False
    """A receiver that lost its sender may be made again with `receiver(cfg, have_hash=h)`,
    and a sender still there (or restarted at the same address) answers from hash h."""
    needs_process_group: bool = False
    """Sender and receivers must share a torch.distributed process group (set up by the
    caller)."""


@dataclass(frozen=True)
class SyncContext:
    """What a run tells a transport when it builds its config."""

    scratch_dir: Path
    """A directory the transport may write under; the run empties it before the sender
    starts and removes it after the sender closes."""
    tag: str
    """Unique to this sender (pid and a random part): a name for shared-memory segments."""
    host: str = "127.0.0.1"
    """The address of the trainer's node, where a network sender listens."""


@dataclass(frozen=True)
class Transport:
    name: str
    config: Callable[[Any, SyncContext], Any]
    """(the run's `weights` section, context) -> the config the sender is built with."""
    sender: type
    receiver: type
    abilities: Abilities
    connect: Callable[[Any, Any], Any] = lambda cfg, sender: cfg
    """(sender config, started sender) -> the config receivers connect with (tcp: the port
    the sender picked)."""
    owned: Callable[[Any], Path | None] = lambda sender: None
    """A directory outside the scratch dir that the sender made and the run removes on close
    (shm: its /dev/shm segment directory)."""
    not_in_loop: str = ""
    """Why the training loop cannot select it (empty: it can)."""


class UnknownTransport(RegistryError):
    """A transport name that is not registered, or a "module:ATTR" path that is no record."""


def _transport(name: str, entry):
    if not isinstance(entry, Transport):
        raise TypeError(f"is {type(entry).__name__}, not a weights.registry.Transport")
    return entry


TRANSPORTS = Registry("weights.transport", {
    "inproc": "traingym.weights.inproc:TRANSPORT",
    "shm": "traingym.weights.filesystem:SHM",
    "tcp": "traingym.weights.tcp:TRANSPORT",
    "filesystem": "traingym.weights.filesystem:TRANSPORT",
    "dist": "traingym.weights.dist:TRANSPORT",
}, kind="ATTR", check=_transport, error=UnknownTransport)

get = TRANSPORTS.get  # the record registered as `name`, or the record at a "module:ATTR" path


def loop_choices() -> list[str]:
    """The registered names the training loop can select."""
    return [n for n in TRANSPORTS.names() if not get(n).not_in_loop]


def able(ability: str) -> list[str]:
    """The loop-selectable registered names with `ability` (an Abilities field)."""
    return TRANSPORTS.able(ability, loop_choices())


def open_sender(name: str, weights_cfg, ctx: SyncContext) -> tuple[Any, Any]:
    """Start the sender of transport `name`; return (receivers' config, sender)."""
    entry = get(name)
    cfg = entry.config(weights_cfg, ctx)
    sender = entry.sender(cfg)
    return entry.connect(cfg, sender), sender
