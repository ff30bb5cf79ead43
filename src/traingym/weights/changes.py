"""What a delta's encode or apply reports (`Changes`), and the thread pool the codecs and
subscribers share (`Pool`): both used by codecs.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from traingym.weights import lthash


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
