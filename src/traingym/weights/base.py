"""Weight-sync seams: the typed records that cross them, the two protocols, the registries.

A weight update travels as a `Payload`: an `UpdateHeader` (JSON on the wire) plus raw byte
buffers. `Codec` turns states into payloads and back; `Transport` moves payloads. A state is
a `dict[str, torch.Tensor]` of contiguous CPU tensors.

Covered: the record types, the codec and transport protocols, the codec registry, the errors.
Not covered here: framing (frame.py), hashing (hashing.py), the policies (sync.py), the
transport registry (registry.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from traingym.core.registry import Registry

State = dict[str, torch.Tensor]


class CastView(Mapping):
    """`state` read as cast to `dtype`, one tensor at a time (None: as it is)."""

    def __init__(self, state: State, dtype: torch.dtype | None) -> None:
        self.state, self.dtype = state, dtype

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self.state[name].detach()
        return t.to(self.dtype) if self.dtype is not None else t

    def made(self, name: str, t: torch.Tensor) -> bool:
        """Whether `t`, read here as `name`, is a cast this view made (a new tensor nothing else
        holds), not the state's own tensor (a cast to the dtype it already has)."""
        own = self.state[name].untyped_storage().data_ptr()
        return self.dtype is not None and t.untyped_storage().data_ptr() != own

    def __iter__(self):
        return iter(self.state)

    def __len__(self) -> int:
        return len(self.state)


@dataclass(frozen=True)
class Changed:
    """Which elements of a state may differ, in the published dtype, from version `base` of it
    (what the optimizer step saw: trainer/step_changes.py): per tensor name, sorted flat
    positions (numpy int64); a name absent holds no change. A superset is allowed (the delta
    codec drops positions whose value is the same); a missing change is not, and the periodic
    full hash of the true state catches it (sync.py). `old` and `new`, where given, hold the
    bits there (the published dtype's width) before and after, so nothing is read from the
    states; a wrong old value fails the receiver's additive hash of that delta."""

    base: int
    positions: dict = field(default_factory=dict)
    old: dict | None = None
    new: dict | None = None


@dataclass(frozen=True)
class TensorEntry:
    """How one tensor is coded in a payload. `buffers` index `Payload.buffers`."""

    name: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    shape: tuple[int, ...]
    method: str  # "raw" (all bytes) | "same" (unchanged) | "sparse" | "tiered" | "xor"
    buffers: tuple[int, ...] = ()
    n_changed: int = 0
    params: tuple[int, ...] = ()  # method-specific integers (e.g. Rice parameters)
    span: tuple[int, ...] = ()  # (start, stop): a piece of the flat tensor; () the whole


@dataclass(frozen=True)
class UpdateHeader:
    """What a payload claims: which version it turns which base into, and how."""

    codec: str  # "full" | "delta"
    target_version: int
    target_hash: str
    base_version: int | None = None  # None for a full update (an anchor)
    base_hash: str | None = None
    tensors: tuple[TensorEntry, ...] = ()
    buffer_sizes: tuple[int, ...] = ()
    body_hash: str = ""
    full_hash: str = ""  # a delta's target's state_hash (xxh3), on the periodic full checks


@dataclass
class Payload:
    """An update: header plus the raw buffers it points into (bytes-like, not copied)."""

    header: UpdateHeader
    buffers: list[memoryview] = field(default_factory=list)

    @property
    def is_anchor(self) -> bool:
        """A whole state (any codec but the delta's): it needs no base."""
        return self.header.codec != "delta"

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)


class IntegrityError(Exception):
    """A payload or a result does not match its hash: never apply or serve it."""


class BaseMismatch(Exception):
    """A delta names a base this receiver does not hold: it needs an anchor."""


class PeerDead(ConnectionError):
    """The other side of a transport died or went silent past its deadline."""


class TransportTimeout(TimeoutError):
    """No update arrived within the time asked for (the sender is alive but quiet)."""


@runtime_checkable
class Codec(Protocol):
    """encode(old, new) -> payload; decode(old, payload) -> new. Bit-exact."""

    type: str

    def encode(self, old: State | None, new: State) -> Payload: ...
    def decode(self, old: State | None, payload: Payload) -> State: ...


@runtime_checkable
class Sender(Protocol):
    """Sending end of a transport. Keeps the chain since the last anchor for late joiners."""
    def send(self, payload: Payload) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class Receiver(Protocol):
    """Receiving end. receive raises TransportTimeout or PeerDead, never hangs."""
    def receive(self, timeout: float) -> Payload: ...

    def resync(self, have_hash: str | None) -> None:
        """Ask for the last anchor and the deltas since (or the deltas after have_hash)."""
        ...

    def close(self) -> None: ...


def _codec(name: str, cls):
    if not (isinstance(cls, type) and callable(getattr(cls, "encode", None))
            and callable(getattr(cls, "decode", None))):
        raise TypeError("not a codec class (one with encode and decode)")
    return cls


CODECS = Registry("weights.codec", {
    "full": "traingym.weights.codecs:FullCodec",
    "delta": "traingym.weights.codecs:DeltaCodec",
}, check=_codec)
"""The codec classes by `UpdateHeader.codec` name, imported on first use. `weights.codec`
names a policy ('auto', 'delta', 'full': the built-in pair) or another full codec (a class
with `delta = False`: every update whole, in its encoding; the receiver decodes with it)."""
