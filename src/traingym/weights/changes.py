"""What a delta's encode or apply reports (`Changes`), the thread pool the codecs and
subscribers share (`Pool`), and how the encoder cuts a state into shards (`plan_pieces`):
all used by codecs.py."""

from __future__ import annotations

import bisect
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from traingym.weights import lthash
from traingym.weights.base import State


@dataclass
class Changes:
    """What an encode or an apply changed, for the incremental hash and the sender's shadow:
    `sum` is the additive hash's movement (lthash.py); `pieces` (name, start, positions,
    new bits) the changed elements of each piece; `times` seconds per phase, summed over
    pieces (over threads: CPU seconds, not wall)."""

    sum: np.ndarray = field(default_factory=lthash.zero)
    pieces: list = field(default_factory=list)
    times: dict = field(default_factory=dict)
    n_changed: int = 0

    def add(self, times: dict) -> None:
        for k, v in times.items():
            self.times[k] = self.times.get(k, 0.0) + v


class Pool:
    """A thread pool made on first use, for codecs and subscribers with threads > 1."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.threads, self._pool = threads, None

    def map(self, fn, items: list) -> list:
        if self.threads == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="weights-codec")
        futures = [self._pool.submit(fn, x) for x in items]
        wait(futures)  # all done before any error is raised: none still writes after it
        return [f.result() for f in futures]


PIECE_ALIGN = 1 << 16  # a tensor is cut into pieces only at multiples of this many elements


def plan_pieces(state: State, shards: int) -> list[list[tuple[str, int, int]]]:
    """Split the state, tensors in sorted name order, into `shards` runs of about equal
    bytes: lists of (name, start, stop) flat element ranges. A tensor is cut only where a
    run ends inside it, at a multiple of PIECE_ALIGN elements, so at most shards - 1 tensors
    are cut (one more header entry each)."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")
    names = sorted(state)
    total = sum(state[n].numel() * state[n].element_size() for n in names)
    ends = [(j + 1) * total // shards for j in range(shards)]  # where each run ends, bytes
    out: list[list[tuple[str, int, int]]] = [[] for _ in range(shards)]
    done = 0  # bytes before the current tensor
    for name in names:
        t = state[name]
        n, w = t.numel(), t.element_size()
        start = 0
        while True:
            k = min(shards - 1, bisect.bisect_right(ends, done + start * w))
            stop = n if k == shards - 1 else min(n, -(-(ends[k] - done) // w))
            if stop < n:
                stop = min(n, max(start + 1, -(-stop // PIECE_ALIGN) * PIECE_ALIGN))
            out[k].append((name, start, stop))
            if stop >= n:
                break
            start = stop
        done += n * w
    return [run for run in out if run]
