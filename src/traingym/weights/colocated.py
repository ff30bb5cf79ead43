"""Weight sync for the colocated loop: the trainer's Publisher and the engine's Subscriber in one
process, over a real codec and transport (sync.py).

`publish(trainer.export(), version)` names the trainer's tensors as the engine's (a tied tensor
once), casts them to the engine's dtype while finding a delta's changes (no cast copy of the
model), sends, and returns only once the subscriber holds `version` verified (resyncing on any
fault). Where the engine offers its own matching tensors (`writable_state`) the subscriber
applies into them in place; the engine does not generate between apply and check. The engine's
tensors are never the trainer's, so an optimizer step cannot change what it serves.
Memory beside the engine: the subscriber's copy unless in place (in place, the publisher's
shadow is the engine's tensors too: Publisher.share_shadow) and the transport's chain (none for
inproc once caught up). Transports: any registry.py entry.
Not covered: the dist transport (needs a process group), engines in other processes (async mode,
cluster/local.py and cluster/engine_process.py).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import uuid
import weakref
from pathlib import Path

import torch

from traingym.core import trace
from traingym.core.ties import alias_groups
from traingym.weights import registry
from traingym.weights.base import Changed, State
from traingym.weights.sync import (
    Publisher,
    PublisherConfig,
    PublishStats,
    Subscriber,
    SubscriberConfig,
)


def wire_views(state: State) -> State:
    """The state's tensors as the engine's names them, not cast: detached, contiguous, and
    each aliased tensor (tied weights) once, under its first name in sorted order."""
    return {g[0]: state[g[0]].detach().contiguous() for g in alias_groups(state)}


def wire_state(state: State, dtype: torch.dtype) -> State:
    """The state as the engine holds it: `wire_views` cast to `dtype`."""
    return {k: v.to(dtype).contiguous() for k, v in wire_views(state).items()}


class ColocatedSync:
    """Publisher + subscriber + engine. `cfg` is the run config's `weights` section."""

    def __init__(self, engine, cfg, dtype: torch.dtype, scratch_dir: Path) -> None:
        self.engine, self.cfg, self.dtype = engine, cfg, dtype
        self.scratch_dir = scratch_dir
        self.tag = f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        transport = registry.get(cfg.transport)
        _remove(scratch_dir)  # frames of an earlier session of this run
        tc, self.sender = registry.open_sender(cfg.transport, cfg,
                                               registry.SyncContext(scratch_dir, self.tag))
        self.publisher = Publisher(self.sender, PublisherConfig(cfg.codec, cfg.anchor_budget,
                                                                threads=cfg.threads))
        self.subscriber = Subscriber(transport.receiver(tc),
                                     SubscriberConfig(threads=cfg.threads))
        own = getattr(engine, "writable_state", None)
        self._own: State | None = own() if callable(own) else None
        self.in_place = False  # the subscriber applies into the engine's own tensors
        self.last: dict = {}
        # Shared memory outlives the process: remove it at exit even if close() is never called.
        self._cleanup = weakref.finalize(self, _remove, scratch_dir, transport.owned(self.sender))

    @property
    def version(self) -> int | None:
        return self.subscriber.version

    def publish(self, state: State, version: int, changed: Changed | None = None) -> PublishStats:
        """Send `version`; return once the engine serves it, verified (or raise). `changed`:
        the trainer's record of what changed since the last version (Publisher.publish)."""
        t0 = time.perf_counter()
        wire = wire_views(state)  # cast by the publisher, in the pass that finds the changes
        t1 = time.perf_counter()
        if self.subscriber.version is None and self._own is not None:
            self._adopt_engine_tensors(wire)
        before = dataclasses.replace(self.subscriber.stats)
        stats = self.publisher.publish(wire, version, cast=self.dtype, changed=changed)
        t2 = time.perf_counter()
        verified = self.subscriber.wait_for(version, self.cfg.timeout_s)
        t3 = time.perf_counter()
        with trace.span("apply", cat="weights", version=version):
            self.engine.update_weights(verified, version)
        if self.in_place:
            self.publisher.share_shadow(verified)  # no copy of the model beside the engine's
        forget = getattr(self.sender, "forget_chain", None)
        if forget is not None:  # the one receiver holds the version: keep no frames for it
            forget(self.publisher.reanchor)
        t4 = time.perf_counter()
        after = self.subscriber.stats
        numel = sum(t.numel() for t in wire.values())
        self.last = {
            "sync_version": version, "sync_codec": stats.codec, "sync_reason": stats.reason,
            "sync_bytes": stats.payload_bytes, "sync_full_bytes": stats.full_bytes,
            "sync_changed_frac": stats.changed / numel if stats.changed >= 0 else None,
            "sync_corrupt": after.corrupt - before.corrupt,
            "sync_resyncs": after.resyncs - before.resyncs,
            "sync_cast_s": t1 - t0, "sync_encode_s": stats.encode_s, "sync_send_s": stats.send_s,
            "sync_apply_s": t3 - t2, "sync_engine_s": t4 - t3,
        }
        return stats

    def lent_casts(self, names: set[str]) -> State | None:
        """The engine's bf16 tensors for `names` (trainer/casts.py): the casts of the weights
        last published, so of the trainer's weights only until they next change: the sync loop
        lends them to the trainer right after a publish, for its next step only
        (TorchTrainer.lend). None unless applied in place, bf16, verified and shared with the
        publisher (then nothing else writes them)."""
        if not (self.in_place and self.dtype == torch.bfloat16 and self.subscriber.valid
                and self.publisher.shared):
            return None
        own = self.subscriber.state
        if not names <= set(own):
            return None
        return {n: own[n] for n in names}

    def _adopt_engine_tensors(self, wire: State) -> None:
        """Before the first update: apply into the engine's own tensors when they are exactly what
        is published (names, engine dtype, shapes, contiguous) and share no memory with the
        trainer's (else deltas would land in the masters); else use the subscriber's copy."""
        own = self._own
        trainer = {t.untyped_storage().data_ptr() for t in wire.values()}
        fits = set(own) == set(wire) and all(
            own[k].dtype == self.dtype and own[k].shape == wire[k].shape
            and own[k].is_contiguous() for k in wire) and not any(
            t.untyped_storage().data_ptr() in trainer for t in own.values())
        if fits:
            self.subscriber = Subscriber(self.subscriber.receiver, self.subscriber.cfg, state=own)
        self.in_place, self._own = fits, None

    def close(self) -> None:
        self.subscriber.receiver.close()
        self.sender.close()
        self._cleanup()


def _remove(*paths: Path | None) -> None:
    for path in paths:
        if path is not None and path.exists():
            shutil.rmtree(path)
