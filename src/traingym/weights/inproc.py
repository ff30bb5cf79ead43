"""In-process transport: a named hub; payload objects are handed over, not copied.

Covered: fan-out to any number of receivers, late joiners (they get the chain at once),
resync, a bounded queue per receiver (past `max_pending` it is cleared, and the receiver
resyncs on the next delta it cannot apply), PeerDead once the sender closed, and a chain
that keeps no frames once its receivers are up to date (`forget_chain`: an anchor is then
made on demand).
Not covered: anything across processes (use shm, tcp, filesystem or dist).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from traingym.weights.base import Payload, PeerDead, TransportTimeout
from traingym.weights.registry import Abilities, Transport
from traingym.weights.chain import Chain


@dataclass(frozen=True)
class InprocConfig:
    type: str = "inproc"
    name: str = "default"
    max_pending: int = 16


class _Hub:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.chain = Chain()
        self.receivers: list[InprocReceiver] = []
        self.closed = False


_HUBS: dict[str, _Hub] = {}
_HUBS_LOCK = threading.Lock()


def _hub(name: str, fresh: bool = False) -> _Hub:
    with _HUBS_LOCK:
        if fresh or name not in _HUBS:
            _HUBS[name] = _Hub()
        return _HUBS[name]


class InprocSender:
    def __init__(self, cfg: InprocConfig = InprocConfig()) -> None:
        self.hub = _hub(cfg.name, fresh=True)

    def send(self, payload: Payload) -> None:
        with self.hub.lock:
            self.hub.chain.add(payload)
            for r in self.hub.receivers:
                r._push(payload)
            self.hub.lock.notify_all()

    def forget_chain(self, source) -> None:
        """Keep no frames (Chain.forget): a receiver that needs an anchor later gets
        `source()`, a fresh one of the newest version. For a sender whose receivers are up
        to date (the colocated sync calls it once its subscriber holds the version)."""
        with self.hub.lock:
            self.hub.chain.forget(source)

    def close(self) -> None:
        with self.hub.lock:
            self.hub.closed = True
            self.hub.chain = Chain()  # a closed hub keeps no weights alive
            self.hub.lock.notify_all()


class InprocReceiver:
    def __init__(self, cfg: InprocConfig = InprocConfig()) -> None:
        self.cfg = cfg
        self.hub = _hub(cfg.name)
        self._queue: deque[Payload] = deque()
        with self.hub.lock:
            self._queue.extend(self.hub.chain.since(None))
            self.hub.receivers.append(self)

    def _push(self, payload: Payload) -> None:  # called with the hub lock held
        if len(self._queue) >= self.cfg.max_pending:
            self._queue.clear()
        self._queue.append(payload)

    def receive(self, timeout: float) -> Payload:
        deadline = time.monotonic() + timeout
        with self.hub.lock:
            while not self._queue:
                if self.hub.closed:
                    raise PeerDead("inproc sender closed")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportTimeout(f"no update in {timeout}s")
                self.hub.lock.wait(left)
            return self._queue.popleft()

    def resync(self, have_hash: str | None) -> None:
        with self.hub.lock:
            self._queue.clear()
            self._queue.extend(self.hub.chain.since(have_hash))

    def close(self) -> None:
        with self.hub.lock:
            if self in self.hub.receivers:
                self.hub.receivers.remove(self)


TRANSPORT = Transport("inproc", lambda w, ctx: InprocConfig(name=ctx.tag), InprocSender,
                      InprocReceiver, Abilities(crosses_processes=False, crosses_nodes=False))
