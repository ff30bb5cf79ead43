"""Publisher (trainer side) and Subscriber (engine side): versions, anchors, verification.

The publisher keeps a shadow of what receivers hold and sends deltas against it; a full update
(anchor) goes first, on a structure change, when delta bytes since the last anchor pass
`anchor_budget` x the full size (so a late joiner needs about two full transfers), or, with codec
"auto", when it would be faster.
Verification follows the change, not the model: an anchor's target hash is the xxh3 state hash
(hashing.py), a delta's the anchor's hash plus the additive hash's movement (lthash.py), which both
sides keep from the changes; every `full_hash_every`-th delta also carries a full hash.
The subscriber checks the body hash before touching a weight, refuses a delta on another base, is
servable only at the target hash, and resyncs through the transport on any failure; with `reconnect`
it survives a lost sender (PeerDead), serving its last verified version meanwhile.
Not covered: applying while the engine generates (call `poll` between generations).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch

from traingym.core import trace
from traingym.weights import lthash
from traingym.weights.base import (
    CODECS,
    BaseMismatch,
    CastView,
    Changed,
    IntegrityError,
    Payload,
    PeerDead,
    Receiver,
    Sender,
    State,
    TransportTimeout,
)
from traingym.weights.changes import Changes
from traingym.weights.codecs import FullCodec, apply_changes
from traingym.weights.frame import seal, verify_body
from traingym.weights.hashing import raw_state_hash, state_hash


@dataclass(frozen=True)
class PublisherConfig:
    codec: str = "auto"
    """"delta", "full", or "auto" (delta unless a full send is predicted faster)."""
    anchor_budget: float = 1.0
    """Send an anchor once delta bytes since the last one would exceed this x full size."""
    zstd_level: int = 1
    """zstd level for the delta codec's zstd streams."""
    full_hash_every: int = 16
    """Every this many deltas since an anchor, the delta carries its target's full (xxh3)
    state hash too, checked by receivers over their whole state; 0: anchors only."""
    threads: int = 1
    """Threads the delta codec codes with, each its own shard of the state."""


@dataclass(frozen=True)
class PublishStats:
    version: int
    codec: str
    payload_bytes: int
    full_bytes: int
    changed: int
    encode_s: float
    send_s: float
    reason: str
    phases: dict = dataclasses.field(default_factory=dict)
    """Seconds of a delta's encode phases (extract, code, verify: summed over threads; shadow:
    writing the changed elements into the publisher's copy, after the send and outside
    encode_s unless a full hash needed it first); empty for a full update."""


BUILT_IN = ("auto", "delta", "full")  # weights.codec policies over the built-in pair


class Publisher:
    """publish(state, version) after each optimizer step; the state is never mutated (it is
    kept by reference, for a shared shadow's reanchor: share_shadow)."""

    def __init__(self, sender: Sender, cfg: PublisherConfig = PublisherConfig()) -> None:
        self.sender, self.cfg = sender, cfg
        self.full = CODECS.get("full")()
        if cfg.codec not in BUILT_IN:  # another full codec: every update whole, in it
            codec = CODECS.get(cfg.codec)
            if getattr(codec, "delta", False):
                raise ValueError(f"weights.codec={cfg.codec!r} is a delta codec: only the "
                                 "built-in 'delta' is covered (the receiver's additive hash "
                                 "reads its frames); a codec of your own is a full one")
            self.full = codec()
        self.delta = CODECS.get("delta")(cfg.zstd_level, cfg.threads)
        self.version: int | None = None
        self.hash: str | None = None  # the chain's name for the last version (not always xxh3)
        self._shadow: State | None = None
        # share_shadow: the shadow is a same-process subscriber's state, which its apply (not
        # the publisher) moves to each target; reanchors cast the last published state instead
        self._shared = False
        self._published: tuple[State, torch.dtype | None] | None = None
        self._since_anchor = 0
        self._anchor_hash = ""
        self._sum = lthash.zero()  # the additive hash's movement since the anchor
        self._deltas = 0  # deltas since the anchor
        self._hinted = False  # a delta since the anchor read only `changed` positions
        self._link_s_per_byte: float | None = None
        self._delta_s: float | None = None  # encode time of the last delta
        self._full_s: float | None = None  # encode time of the last full update

    @property
    def policy(self) -> str:
        """'auto', 'delta' or 'full' (another codec is a full one)."""
        return self.cfg.codec if self.cfg.codec in BUILT_IN else "full"

    @property
    def _full_name(self) -> str:
        """The codec name receivers decode anchors by: the built-in's, or as configured."""
        return "full" if self.cfg.codec in BUILT_IN else self.cfg.codec

    def _structure_changed(self, state: State, cast: torch.dtype | None) -> bool:
        s = self._shadow
        return s is None or set(s) != set(state) or any(
            s[k].dtype != (cast or v.dtype) or s[k].shape != v.shape for k, v in state.items())

    def publish(self, state: State, version: int, cast: torch.dtype | None = None,
                changed: Changed | None = None) -> PublishStats:
        """Send `state` as `version`. With `cast`, `state` holds the trainer's tensors and
        what is published is their cast to `cast` (what the engine holds): a delta then finds
        its changes while casting (extract.cast_changes), with no cast copy of the model, and
        an anchor casts a copy. `changed` since the last version published (its `base`; else
        ignored) lets a delta read only those elements; then every full hash is of `state`
        itself, so a change it missed fails the receivers' check."""
        if self.version is not None and version <= self.version:
            raise ValueError(f"version {version} is not after {self.version}")
        width = torch.empty(0, dtype=cast).element_size() if cast is not None else None
        full_bytes = sum(t.numel() * (width or t.element_size()) for t in state.values())
        t0 = time.perf_counter()
        reason = "delta"
        if self._structure_changed(state, cast):
            reason = "first" if self._shadow is None else "structure"
        elif self.policy == "full":
            reason = f"codec={self.cfg.codec}"
        elif self.policy == "auto" and self._full_predicted_faster(full_bytes):
            reason = "auto:full-faster"
        payload, changes, full_hash, wire, phases = None, None, "", None, {}
        if reason == "delta":
            hint = changed if changed is not None and changed.base == self.version else None
            self._hinted = self._hinted or hint is not None
            payload, changes = self.delta.encode_changes(
                self._shadow, state, cast=cast, link_s_per_byte=self._link_s_per_byte,
                changed=hint)
            self._delta_s = time.perf_counter() - t0
            if self._since_anchor + payload.nbytes > self.cfg.anchor_budget * full_bytes:
                payload, reason = None, "anchor-budget"
        if payload is None:
            if self._shared and reason not in ("first", "structure"):
                wire = CastView(state, cast)  # only the subscriber writes the engine's
            else:
                self._shared = False
                wire = state if cast is None else self._cast_anchor(state, cast, reason)
            payload = self.full.encode(None, wire)
            target_hash = self._anchor_state_hash(payload, wire)
        else:
            self._sum = self._sum + changes.sum
            self._since_anchor += payload.nbytes
            self._deltas += 1
            phases = dict(changes.times)
            target_hash = lthash.identity(self._anchor_hash, self._sum)
            every = self.cfg.full_hash_every
            if every and self._deltas % every == 0 and (self._shared or self._hinted):
                t_hash = time.perf_counter()
                full_hash = state_hash(CastView(state, cast))  # one tensor cast at a time
                phases["full_hash"] = time.perf_counter() - t_hash
            elif every and self._deltas % every == 0:
                self._update_shadow(changes, phases)
                full_hash = state_hash(self._shadow)  # the shadow is the target now
        anchor = payload.is_anchor
        header = dataclasses.replace(
            payload.header, codec=payload.header.codec if not anchor else self._full_name,
            target_version=version, target_hash=target_hash,
            base_version=None if anchor else self.version, base_hash=None if anchor else self.hash,
            full_hash=full_hash)
        payload = seal(Payload(header, payload.buffers))
        encode_s = time.perf_counter() - t0
        trace.took("encode", "weights", encode_s, codec=header.codec, version=version)
        if anchor:
            self._full_s = encode_s
        t1 = time.perf_counter()
        try:
            with trace.span("transfer", cat="weights", bytes=payload.nbytes, version=version):
                self.sender.send(payload)
        except BaseException:
            # it may hold an unsent version: the next update is an anchor
            self._shadow, self._shared = None, False
            raise
        send_s = time.perf_counter() - t1
        if not anchor and "shadow" not in phases and not self._shared:
            self._update_shadow(changes, phases)  # after the send: beside the receiver's apply
        if payload.nbytes > 1 << 20:
            self._link_s_per_byte = send_s / payload.nbytes
        if anchor and not self._shared and wire is not self._shadow:
            self._shadow = wire if cast is not None else {
                k: v.detach().clone() for k, v in wire.items()}
        if anchor:
            self._since_anchor, self._deltas, self._hinted = 0, 0, False
            self._anchor_hash, self._sum = target_hash, lthash.zero()
        self.version, self.hash = version, target_hash
        self._published = (state, cast)
        changed = changes.n_changed if not anchor else -1
        return PublishStats(version, header.codec, payload.nbytes, full_bytes, changed,
                            encode_s, send_s, reason, phases)

    def _anchor_state_hash(self, payload: Payload, state: State) -> str:
        """state_hash of what an anchor holds: from the built-in full codec's payload (the
        bytes it just read, so no second pass over the state, nor a second cast of it), else
        from the state."""
        if isinstance(self.full, FullCodec):
            return raw_state_hash(payload.header.tensors, payload.buffers)
        return state_hash(state)

    @property
    def shared(self) -> bool:
        """The shadow is a subscriber's state (share_shadow), not a copy of the publisher's."""
        return self._shared

    def share_shadow(self, state: State) -> None:
        """From now on the shadow is `state`: a same-process subscriber's verified tensors (the
        engine's own), which hold the last published version and which that subscriber's apply
        moves to each new target. The publisher then keeps no copy of the model: it never
        writes them (a delta's full hash and a reanchor cast the trainer's state, one tensor at
        a time, instead), and until the next publish the trainer's state must not change. An
        anchor of a new structure makes a copy again; call this again after it."""
        if self._shared and self._shadow is state:
            return
        if self._shadow is None or set(state) != set(self._shadow) or any(
                state[k].dtype != v.dtype or state[k].shape != v.shape
                for k, v in self._shadow.items()):
            raise ValueError("share_shadow: the state does not have the published structure")
        self._shadow, self._shared = state, True

    def _update_shadow(self, changes, phases: dict) -> None:
        """The shadow becomes the delta's target: its changed elements written, O(changes)."""
        t0 = time.perf_counter()
        self.delta.write(self._shadow, changes)
        phases["shadow"] = time.perf_counter() - t0

    def _cast_anchor(self, state: State, cast: torch.dtype, reason: str) -> State:
        """The anchor's target, `state` cast: into the shadow's own tensors when it has the same
        structure (it becomes the shadow anyway), else into new tensors, saving a model-sized
        copy per full send."""
        if reason in ("first", "structure"):
            return {k: v.detach().to(cast, copy=True).contiguous() for k, v in state.items()}
        for k, v in state.items():
            self._shadow[k].copy_(v.detach())
        return self._shadow

    def reanchor(self) -> Payload | None:
        """A fresh anchor of the last published version, from the shadow (a copy of it), for
        a chain that forgot its frames (Chain.forget); the chain's names start from it, so
        the next delta's base is this anchor. None when there is no shadow (after a failed
        send: the next publish sends an anchor). Not thread-safe against `publish`."""
        if self._shadow is None:
            return None
        source = self._shadow
        if self._shared or self._hinted:  # what failed may be the receiver's state, or a hint
            source = CastView(*self._published)
        payload = self.full.encode(None, source)
        target_hash = self._anchor_state_hash(payload, source)
        header = dataclasses.replace(payload.header, codec=self._full_name,
                                     target_version=self.version, target_hash=target_hash)
        self._since_anchor, self._deltas = 0, 0
        self._anchor_hash, self._sum = target_hash, lthash.zero()
        self.hash = target_hash
        return seal(Payload(header, payload.buffers))

    def full_hash(self) -> str | None:
        """The xxh3 state hash of the last published version (a pass over the state)."""
        if self._shadow is None:
            return None
        if self._shared:
            return state_hash(CastView(*self._published))
        return state_hash(self._shadow)

    def _full_predicted_faster(self, full_bytes: int) -> bool:
        if self._link_s_per_byte is None or self._delta_s is None:
            return False
        delta_guess = 0.02 * full_bytes  # a pessimistic delta size; the link term is small
        # Each side's work counted twice (the receiver's decode, or copy, mirrors the sender's
        # encode; a full send includes a state hash on each side), plus the link.
        t_delta = 2 * self._delta_s + delta_guess * self._link_s_per_byte
        t_full = 2 * (self._full_s or 0.0) + full_bytes * self._link_s_per_byte
        return t_full < t_delta


def decode(state: State | None, payload: Payload, threads: int,
           delta: bool) -> tuple[State, Changes]:
    """The payload applied: the built-in frames by apply_changes (a delta with the additive
    hash's movement), another full codec's by its own `decode` (CODECS, by header name)."""
    name = payload.header.codec
    if name in ("full", "delta"):
        return apply_changes(state, payload, threads, with_sum=delta)
    return CODECS.get(name)().decode(None, payload), Changes()


@dataclass(frozen=True)
class SubscriberConfig:
    verify_base: bool = False
    """Re-hash the held state (xxh3) before applying each delta, against its hash after the
    last apply: catches a weight changed behind the subscriber's back at the next delta, at
    two passes over the state per delta. Off, such a change is caught when a later delta
    writes that weight, or at the next full check (PublisherConfig.full_hash_every)."""
    resync_every_s: float = 2.0
    """While waiting for a resync, ask again this often."""
    threads: int = 1
    """Threads that apply a delta's pieces in parallel."""


@dataclass
class SubscriberStats:
    applied: int = 0
    anchors: int = 0
    corrupt: int = 0
    refused: int = 0
    skipped: int = 0
    resyncs: int = 0
    reconnects: int = 0


class NotServable(RuntimeError):
    """The subscriber holds no verified state."""


class Subscriber:
    """Applies updates into `state` (the engine's tensors, in place where shapes match)."""

    def __init__(self, receiver: Receiver, cfg: SubscriberConfig = SubscriberConfig(),
                 state: State | None = None,
                 reconnect: Callable[[str | None], Receiver] | None = None) -> None:
        self.receiver, self.cfg, self.reconnect = receiver, cfg, reconnect
        self._state = state
        self.valid = False
        self.version: int | None = None
        self.hash: str | None = None
        self.stats = SubscriberStats()
        self._asked_at: float | None = None
        self._anchor_hash = ""
        self._sum = lthash.zero()  # the additive hash's movement since the anchor
        self._local_full: str | None = None  # xxh3 after the last apply (verify_base)
        self.phases: dict = {}  # seconds per phase of the last apply (decode, apply, verify)

    @property
    def state(self) -> State:
        """The verified state; raises NotServable rather than hand out unverified weights."""
        if not self.valid:
            raise NotServable("no verified weights yet (or the last update failed)")
        return self._state

    def _ask(self) -> None:
        now = time.monotonic()
        if self._asked_at is None or now - self._asked_at > self.cfg.resync_every_s:
            self.receiver.resync(self.hash if self.valid else None)
            self._asked_at = now
            self.stats.resyncs += 1

    def _reconnect(self, lost: PeerDead) -> None:
        try:
            self.receiver.close()
        except OSError:
            pass
        try:
            self.receiver = self.reconnect(self.hash if self.valid else None)
        except OSError as err:
            raise PeerDead(f"lost the sender ({lost}) and could not reconnect: {err}") from err
        self._asked_at = None
        self.stats.reconnects += 1

    def poll(self, timeout: float) -> bool:
        """Receive one update and apply it if it fits. True when the version advanced."""
        try:
            p = self.receiver.receive(timeout)
            verify_body(p)
        except PeerDead as lost:
            if self.reconnect is None:
                raise
            self._reconnect(lost)
            return False
        except IntegrityError:
            self.stats.corrupt += 1
            self._ask()
            return False
        h = p.header
        delta = h.codec == "delta"
        renamed = not delta and h.target_hash != self.hash  # Publisher.reanchor
        if self.valid and (h.target_version < self.version
                           or h.target_version == self.version and not renamed):
            self.stats.skipped += 1
            return False
        if delta and (not self.valid or h.base_hash != self.hash):
            self.stats.refused += 1
            self._ask()
            return False
        if delta and self.cfg.verify_base and state_hash(self._state) != self._local_full:
            self.valid = False
            self.stats.corrupt += 1
            self._ask()
            return False
        self.valid = False  # from here on the tensors may be half-written
        try:
            with trace.span("decode", cat="weights", version=h.target_version, codec=h.codec):
                new, changes = decode(self._state, p, self.cfg.threads, delta)
        except (IntegrityError, BaseMismatch):
            self.stats.corrupt += 1
            self._ask()
            return False
        t0 = time.perf_counter()
        with trace.span("verify", cat="weights", version=h.target_version):
            if delta:
                moved = self._sum + changes.sum
                same = lthash.identity(self._anchor_hash, moved) == h.target_hash
                checked = same and (bool(h.full_hash) or self.cfg.verify_base)
                full = state_hash(new) if checked else None  # the periodic full check
                if same and h.full_hash:
                    same = full == h.full_hash
            else:
                moved, full = lthash.zero(), state_hash(new)
                same = full == h.target_hash
        self.phases = {**changes.times, "check": time.perf_counter() - t0}
        if not same:
            self.stats.corrupt += 1
            self._ask()
            return False
        self._state, self.valid = new, True
        self.version, self.hash, self._asked_at = h.target_version, h.target_hash, None
        self._sum, self._local_full = moved, full
        if not delta:
            self._anchor_hash = h.target_hash
        self.stats.applied += 1
        self.stats.anchors += p.is_anchor
        return True

    def wait_for(self, version: int, timeout: float) -> State:
        """Poll until the verified version is at least `version`."""
        deadline = time.monotonic() + timeout
        while not (self.valid and self.version >= version):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportTimeout(f"version {version} not reached in {timeout}s")
            self.poll(left)
        return self.state
