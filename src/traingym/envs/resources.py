"""What one run's envs keep across episodes, owned by that run: warm sandbox pools (one per
event loop, backend and limits), the sandbox workers' client, per-prompt draw counts, a
connection. Two runs in one process (one after the other, or at once in two threads or two
event loops) never share any of it, and closing one run closes only its own.

Who makes a `RunResources`, and who closes it:
- sync mode: `build_run` (run.py) makes one per run; the run's training runner and its
  evaluation runners (evaluate.py) share it; `Run.close` closes it;
- async mode: each engine process (cluster/engine_process.py) makes its own, with the sandbox
  workers' client when `cluster.sandbox_workers` is set; a Ray engine actor runs the same code,
  so each actor has its own; the engine closes it when it stops serving;
- a `RolloutRunner` given none makes and closes its own (a test, a one-off evaluation).

How an env reaches it: `current()`, inside an episode. The runner makes its resources current
for every coroutine of a collection (a `contextvars.ContextVar` set in the collecting task and
inherited by the tasks it starts). A ContextVar, not an argument, because the user-facing env
protocol (envs/base.py: a maker `(example, renderer) -> Env`, `reset()`, `step()`) has no place
for it, and envs that keep nothing should not have to take one. A ContextVar belongs to a task,
so two runners in one thread, or two loops in two threads, each see their own.

Objects bound to an event loop (a SandboxPool's asyncio tasks and pipes) are kept per loop
(`keep_on_loop`) and closed, in the order they were made, by the runner that owns the loop
(`close_loop`) before the loop stops; `close()` then forgets the rest and refuses later use.
Outside a runner (a script or test that steps an env itself), `async with RunResources():`
makes one current and closes it at the end of the block.

Not covered: sharing one pool between runs on purpose; closing objects of a loop whose runner
never closed it (`close()` names them instead, as a leak is a bug).
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
