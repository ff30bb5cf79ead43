"""What one run's envs keep across episodes: warm sandbox pools (per event loop, backend and
limits), the sandbox workers' client, per-prompt draw counts. Two runs in one process never
share any of it, and closing one run closes only its own.

Owners: loop/build.py's run (sync mode), each engine process (async mode), or a RolloutRunner
given none. Envs reach it through `current()`, a ContextVar rather than an argument, because
the env protocol (envs/base.py) has no place for it and envs that keep nothing should not take
one. Loop-bound objects are kept per loop (`keep_on_loop`) and closed by the loop's runner
(`close_loop`); outside a runner, use `async with RunResources():`.
Not covered: sharing one pool between runs on purpose; objects of a loop whose runner never
closed it (`close()` names them, as a leak is a bug).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterator
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class SandboxClient(Protocol):
    """Sandboxes elsewhere (cluster/ray_sandboxes.py's RemoteSandboxes): `pool` returns an
    object with SandboxPool's `session()` / `exec()` shape."""
    def pool(self, backend: str, limits: Any) -> Any: ...


class RunResources:
    """One run's env resources; see the module docstring."""

    def __init__(self, sandboxes: SandboxClient | None = None):
        self.sandboxes = sandboxes  # None: sandboxes run in this process's own pools
        self.closed = False
        self._kept: dict[Hashable, Any] = {}
        self._closers: dict[asyncio.AbstractEventLoop, list[Callable[[], Awaitable[None]]]] = {}
        self._lock = threading.RLock()  # make() may keep() too

    def keep(self, key: Hashable, make: Callable[[], T]) -> T:
        """The run's object under `key`, made by `make()` on first use (not bound to a loop:
        a counter, a cache). Callers namespace their keys, e.g. ("latency.draws",)."""
        with self._lock:
            self._check_open()
            if key not in self._kept:
                self._kept[key] = make()
            return self._kept[key]

    def keep_on_loop(self, key: Hashable, make: Callable[[], T],
                     close: Callable[[T], Awaitable[None]]) -> T:
        """Like `keep`, per running event loop: made there on first use, and `await close(obj)`
        when that loop's runner closes (`close_loop`)."""
        loop = asyncio.get_running_loop()
        full = (loop, key)
        with self._lock:
            self._check_open()
            if full not in self._kept:
                obj = self._kept[full] = make()

                async def closer() -> None:
                    del self._kept[full]
                    await close(obj)

                self._closers.setdefault(loop, []).append(closer)
            return self._kept[full]

    async def close_loop(self) -> None:
        """Close (in the order they were made) and forget the running loop's objects."""
        with self._lock:
            closers = self._closers.pop(asyncio.get_running_loop(), [])
        for close in closers:
            await close()

    def close(self) -> None:
        """End the run's resources: later use raises. Raises if a loop still holds objects
        (its runner did not close it), naming how many."""
        with self._lock:
            self.closed = True
            left = {loop: len(c) for loop, c in self._closers.items()}
            self._kept.clear()
            self._closers.clear()
        if left:
            raise RuntimeError(f"run resources closed with {sum(left.values())} object(s) still "
                               f"open on {len(left)} event loop(s): the runner of each loop must "
                               "`await resources.close_loop()` on it before the run closes")

    @contextlib.contextmanager
    def use(self) -> Iterator[RunResources]:
        """Make these the current resources within the block (this task and tasks it starts)."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    async def __aenter__(self) -> RunResources:
        self._token = _CURRENT.set(self)
        return self

    async def __aexit__(self, *exc) -> None:
        _CURRENT.reset(self._token)
        await self.close_loop()
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("these run resources are closed: their run has ended")


_CURRENT: ContextVar[RunResources | None] = ContextVar("traingym_run_resources", default=None)


def current() -> RunResources:
    """The resources of the run whose episode is running; raises outside one."""
    resources = _CURRENT.get()
    if resources is None:
        raise RuntimeError("no run's resources are current: envs that keep resources (a sandbox "
                           "pool, draw counts) run inside a RolloutRunner, which makes its run's "
                           "current; outside one, wrap the code in `async with RunResources():` "
                           "(traingym.envs.resources)")
    return resources
