"""The weight-sync transports, one registry: each transport declares itself in its own file.

A transport is one file with a `TRANSPORT = Transport(...)` record (its name, how its config
is built from the run's `weights` section, its sender and receiver classes, its abilities)
plus one entry in `TRANSPORTS`: name -> "module:ATTR" (imported on first use) or the record
itself. A run picks one with `weights.transport`: a name here, or a "module:ATTR" path to a
record in any importable package (checked when the config is built).

Who reads what:
- the colocated loop (colocated.py): any transport the loop can select (`not_in_loop` empty);
- async mode (cluster/local.py, engine_process.py): those that cross processes; engines get
  the receiver class and config pickled (spawned processes import the class's module), and
  connect again after a lost link only where the transport `reconnects`;
- Ray (cluster/ray.py): those that cross nodes; the config validators (config.py) and their
  error messages list the names by ability.

Not covered: choosing a transport per engine (one transport per run).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

TRANSPORTS: dict[str, str | Transport] = {
    "inproc": "traingym.weights.inproc:TRANSPORT",
    "shm": "traingym.weights.filesystem:SHM",
    "tcp": "traingym.weights.tcp:TRANSPORT",
    "filesystem": "traingym.weights.filesystem:TRANSPORT",
    "dist": "traingym.weights.dist:TRANSPORT",
}


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


class UnknownTransport(ValueError):
    """A transport name that is not registered, or a "module:ATTR" path that is no record."""


_LOADED: dict[str, Transport] = {}


def _load(path: str) -> Transport:
    if path not in _LOADED:
        module, _, attr = path.partition(":")
        if not module or not attr:
            raise UnknownTransport(f"transport path {path!r}: expected 'module:ATTR', e.g. "
                                   "'my_pkg.my_transport:TRANSPORT'")
        try:
            mod = importlib.import_module(module)
        except (ImportError, SyntaxError) as e:
            raise UnknownTransport(f"transport path {path!r}: cannot import {module!r} ({e}); "
                                   "is its package installed or on sys.path?") from e
        entry = getattr(mod, attr, None)
        if not isinstance(entry, Transport):
            raise UnknownTransport(f"transport path {path!r}: {module}.{attr} is "
                                   f"{type(entry).__name__}, not a weights.registry.Transport")
        _LOADED[path] = entry
    return _LOADED[path]


def get(name: str) -> Transport:
    """The transport registered as `name`, or the record at a "module:ATTR" path."""
    entry = TRANSPORTS.get(name)
    if entry is None and ":" in name:
        entry = name
    if entry is None:
        from traingym.core.errors import did_you_mean

        raise UnknownTransport(f"unknown transport {name!r}; choose one of {loop_choices()}, "
                               "or give a 'module:ATTR' path to a weights.registry.Transport"
                               f"{did_you_mean(name, loop_choices())}")
    return entry if isinstance(entry, Transport) else _load(entry)


def loop_choices() -> list[str]:
    """The registered names the training loop can select."""
    return sorted(n for n in TRANSPORTS if not get(n).not_in_loop)


def able(ability: str) -> list[str]:
    """The loop-selectable registered names with `ability` (an Abilities field)."""
    return [n for n in loop_choices() if getattr(get(n).abilities, ability)]


def one_of(names: list[str]) -> str:
    """"'a'", "'a' or 'b'", "'a', 'b' or 'c'"."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def open_sender(name: str, weights_cfg, ctx: SyncContext) -> tuple[Any, Any]:
    """Start the sender of transport `name`; return (receivers' config, sender)."""
    entry = get(name)
    cfg = entry.config(weights_cfg, ctx)
    sender = entry.sender(cfg)
    return entry.connect(cfg, sender), sender
