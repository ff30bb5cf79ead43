"""The frames a late or broken receiver needs (`Chain`): kept by the in-process, tcp and dist
senders, answered from the last anchor onwards."""

from __future__ import annotations

import threading
from typing import Callable

from traingym.weights.base import Payload


class Chain:
    """The last anchor and the deltas since: what a late or broken receiver needs.

    `forget(source)` drops the frames held (an in-process sender whose one receiver is up to
    date keeps no copy of the model for it): until the next anchor, a request the deltas
    added since cannot answer gets `source()`, a fresh anchor of the newest version (the
    publisher's `reanchor`), made in the asking thread."""

    def __init__(self) -> None:
        self._frames: list[Payload] = []
        self._head: str | None = None  # the target hash of the last frame added
        self._source: Callable[[], Payload | None] | None = None
        self._lock = threading.Lock()

    def add(self, p: Payload) -> None:
        with self._lock:
            if p.is_anchor:
                self._frames, self._source = [p], None
            elif not self._frames and self._source is None:
                raise ValueError("the first update on a chain must be an anchor (full)")
            else:
                self._frames = [*self._frames, p]
            self._head = p.header.target_hash

    def forget(self, source: Callable[[], Payload | None]) -> None:
        with self._lock:
            self._frames, self._source = [], source

    def since(self, have_hash: str | None) -> list[Payload]:
        with self._lock:
            frames = self._frames
            for i, p in enumerate(frames if have_hash is not None else ()):
                # a delta from that hash, or the frames after one that reached it (a step
                # that changes nothing keeps the hash: the versions after it still count)
                if not p.is_anchor and p.header.base_hash == have_hash:
                    return frames[i:]
                if p.header.target_hash == have_hash:
                    return frames[i + 1 :]
            if have_hash is not None and have_hash == self._head:
                return []  # up to date with a chain that forgot its frames
            if self._source is None:
                return list(frames)
            anchor = self._source()
            if anchor is None:
                return []
            self._frames, self._source, self._head = [anchor], None, anchor.header.target_hash
            return [anchor]
