"""A warm pool of sandboxes, sized from the measured acquisition rate (Little's law).

Each sandbox holds a running agent, so an execution pays a fork, not an interpreter start.
Every acquisition gets a clean session (reset before reuse; closed after `max_uses` or when
broken, and replaced in the background). `target_size` keeps rate x hold_s busy plus a buffer
of rate x ready_s + z x sqrt(rate x ready_s) (Poisson arrivals), within `min_ready`,
`max_size` and `max_concurrent_starts`.
Not covered: sharing one pool between event loops or processes; priorities among waiters.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from contextlib import asynccontextmanager

from traingym.core import trace
from traingym.sandbox.base import Command, ExecResult, Limits, SandboxError


def target_size(rate: float, hold_s: float, ready_s: float, z: float = 2.0) -> tuple[int, int]:
    """(busy, buffer): sandboxes in use on average and ready ones to keep (both rounded up)."""
    if rate < 0 or hold_s < 0 or ready_s < 0 or z < 0:
        raise ValueError(f"rate, hold_s, ready_s, z must be >= 0, got {rate, hold_s, ready_s, z}")
    busy = rate * hold_s
    during_ready = rate * ready_s
    return math.ceil(busy), math.ceil(during_ready + z * math.sqrt(during_ready))


class Ewma:
    """Exponentially weighted mean of samples."""

    def __init__(self, alpha: float, initial: float):
        self.alpha, self.value = alpha, initial

    def add(self, x: float) -> None:
        self.value += self.alpha * (x - self.value)


class RateEstimate:
    """Events per second, exponentially decayed with time constant `tau_s`."""

    def __init__(self, tau_s: float):
        self.tau_s, self.rate, self.last = tau_s, 0.0, time.monotonic()

    def value(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        return self.rate * math.exp(-(now - self.last) / self.tau_s)

    def add(self) -> None:
        now = time.monotonic()
        self.rate = self.value(now) + 1.0 / self.tau_s
        self.last = now


class SandboxPool:
    """Warm sandboxes from `factory` (e.g. `lambda: BwrapSandbox.create(limits)`).

    Use `async with pool.session() as sandbox:` for a multi-step session, or
    `await pool.exec(command, ...)` for one clean execution. Call `await pool.close()` at the end.
    """

    def __init__(
        self,
        factory: Callable[[], Awaitable],
        *,
        min_ready: int = 1,
        max_size: int = 16,
        max_concurrent_starts: int = 2,
        max_uses: int = 256,
        z: float = 2.0,
        rate_tau_s: float = 5.0,
    ):
        if not 0 <= min_ready <= max_size or max_size < 1 or max_concurrent_starts < 1:
            raise ValueError("need 0 <= min_ready <= max_size, max_size >= 1, starts >= 1")
        self.factory = factory
        self.min_ready, self.max_size = min_ready, max_size
        self.max_concurrent_starts, self.max_uses, self.z = max_concurrent_starts, max_uses, z
        self.ready: deque = deque()
        self.in_use: set = set()
        self.uses: dict = {}  # sessions served, per sandbox
        self.acquired_at: dict = {}
        self.starting = 0
        self.resetting = 0
        self.waiters: deque[asyncio.Future] = deque()  # acquirers blocked, first come first served
        self.rate = RateEstimate(rate_tau_s)
        self.hold_s = Ewma(0.1, 0.01)
        self.ready_s = Ewma(0.2, 0.2)
        self.waits: deque[float] = deque(maxlen=10_000)
        self.counts = {"acquired": 0, "started": 0, "start_failures": 0, "broken": 0,
                       "retired": 0, "reset": 0}  # fmt: skip
        self.start_error: BaseException | None = None
        self.closed = False
        self.tasks: set[asyncio.Task] = set()
        self.busy_time = 0.0
        self.t_open = time.monotonic()
        self.live = 0  # started and not yet closed: ready, in use or resetting
        self.live_time = 0.0  # integral of `live` over time (sandbox-seconds paid for)
        self.t_live = self.t_open

    # -- public -------------------------------------------------------------------------

    def target(self) -> tuple[int, int]:
        busy, buffer = target_size(self.rate.value(), self.hold_s.value, self.ready_s.value, self.z)
        return busy, max(buffer, self.min_ready)

    async def acquire(self):
        if self.closed:
            raise RuntimeError("the pool is closed")
        t0 = time.monotonic()
        self.rate.add()
        sandbox = self._take_ready()
        if sandbox is None:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            self._replenish(need=len(self.waiters))
            try:
                sandbox = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self.acquired_at[waiter.result()] = time.monotonic()
                    await self.release(waiter.result())  # handed over just as we were cancelled
                raise
        self.in_use.add(sandbox)
        self._replenish()
        self.acquired_at[sandbox] = time.monotonic()
        self.waits.append(self.acquired_at[sandbox] - t0)
        self.counts["acquired"] += 1
        return sandbox

    async def release(self, sandbox) -> None:
        held = time.monotonic() - self.acquired_at.pop(sandbox)
        self.hold_s.add(held)
        self.busy_time += held
        self.in_use.discard(sandbox)
        self.uses[sandbox] = self.uses.get(sandbox, 0) + 1
        busy, buffer = self.target()
        surplus = not self.waiters and len(self.ready) + self.resetting > buffer + busy
        if not sandbox.alive:
            self.counts["broken"] += 1
            await self._discard(sandbox)
        elif self.closed or surplus or self.uses[sandbox] >= self.max_uses:
            self.counts["retired"] += 1
            await self._discard(sandbox)
        else:
            self.resetting += 1  # counted now, so _replenish never overshoots max_size
            self._spawn(self._reset(sandbox))
        self._replenish()

    @asynccontextmanager
    async def session(self):
        # the queue wait (observability/utilisation.py), with the pool's state once a sandbox is had
        with trace.span("sandbox_acquire", cat="wait") as span:
            sandbox = await self.acquire()
            if hasattr(span, "args"):  # tracing is on
                span.args.update(self.snapshot())
        try:
            yield sandbox
        finally:
            await self.release(sandbox)

    async def exec(
        self,
        command: Command,
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes] | None = None,
        limits: Limits | None = None,
    ) -> ExecResult:
        async with self.session() as sandbox:
            with trace.span("sandbox_exec", cat="sandbox"):
                return await sandbox.exec(command, stdin=stdin, files=files, limits=limits)

    async def warm(self, n: int) -> None:
        """Start sandboxes until n are ready (at most max_size); for benchmarks and tests."""
        n = min(n, self.max_size)
        while len(self.ready) < n:
            self._replenish(need=n)
            if self.start_error is not None and not self.starting:
                raise self.start_error
            await asyncio.sleep(0.01)

    def snapshot(self) -> dict:
        """The sizing state, as recorded in each sandbox_acquire trace span: sandboxes live
        and in use, the Little's-law target (busy = rate x hold_s, buffer) and its inputs,
        and running totals (acquisitions, busy and live sandbox-seconds) whose differences
        over a window give its rate and utilisation."""
        busy, buffer = self.target()
        self._account_live()
        return {"live": self.live, "in_use": len(self.in_use), "ready": len(self.ready),
                "waiting": len(self.waiters), "target_busy": busy, "target_buffer": buffer,
                "rate_per_s": round(self.rate.value(), 4), "hold_s": round(self.hold_s.value, 5),
                "ready_s": round(self.ready_s.value, 5), "acquired": self.counts["acquired"],
                "started": self.counts["started"], "busy_s": round(self.busy_time, 5),
                "live_s": round(self.live_time, 5), "max_size": self.max_size}

    def stats(self) -> dict:
        waits = sorted(self.waits)
        busy, buffer = self.target()
        elapsed = max(time.monotonic() - self.t_open, 1e-9)
        live = len(self.in_use) + len(self.ready) + self.resetting
        return {
            **self.counts,
            "in_use": len(self.in_use),
            "ready": len(self.ready),
            "starting": self.starting,
            "resetting": self.resetting,
            "waiting": len(self.waiters),
            "acquire_wait_p50_s": waits[len(waits) // 2] if waits else None,
            "acquire_wait_p99_s": waits[min(len(waits) - 1, int(len(waits) * 0.99))]
            if waits else None,
            "acquire_wait_mean_s": sum(waits) / len(waits) if waits else None,
            "utilisation_now": len(self.in_use) / live if live else 0.0,
            "busy_sandbox_seconds_per_second": self.busy_time / elapsed,
            "utilisation_mean": self.busy_time / self._account_live() if self.live_time else 0.0,
            "rate_per_s": self.rate.value(),
            "hold_s": self.hold_s.value,
            "ready_s": self.ready_s.value,
            "target_busy": busy,
            "target_buffer": buffer,
        }

    async def close(self) -> None:
        self.closed = True
        self._fail_waiters(RuntimeError("the pool was closed"))
        while self.tasks:  # a finishing task may have spawned another
            await asyncio.gather(*list(self.tasks))
        while self.ready:
            await self.ready.popleft().close()
        for sandbox in list(self.in_use):
            await sandbox.close()
        self.in_use.clear()
        self._account_live(-self.live)

    # -- internals ----------------------------------------------------------------------

    def _account_live(self, change: int = 0) -> float:
        """Add the sandbox-seconds since the last change, then change `live`; the total."""
        now = time.monotonic()
        self.live_time += self.live * (now - self.t_live)
        self.t_live, self.live = now, self.live + change
        return self.live_time

    def _take_ready(self):
        while self.ready:
            sandbox = self.ready.popleft()
            if sandbox.alive:
                return sandbox
            self.counts["broken"] += 1
            self._spawn(self._discard(sandbox))
        return None

    def _offer(self, sandbox) -> None:
        """Hand a ready sandbox to the longest waiter, or keep it ready."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.in_use.add(sandbox)  # now, so _replenish never overshoots max_size
                waiter.set_result(sandbox)
                return
        self.ready.append(sandbox)

    def _fail_waiters(self, error: BaseException) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    def _replenish(self, need: int = 0) -> None:
        """Start sandboxes so ready + starting + resetting covers the buffer and the waiters."""
        if self.closed:
            return
        busy, buffer = self.target()
        want = max(buffer + max(busy - len(self.in_use), 0), need)
        while (
            len(self.ready) + self.starting + self.resetting < want
            and len(self.in_use) + len(self.ready) + self.starting + self.resetting < self.max_size
            and self.starting < self.max_concurrent_starts
        ):
            self.starting += 1
            self._spawn(self._start())

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _start(self) -> None:
        t0 = time.monotonic()
        try:
            sandbox = await self.factory()
        except Exception as exc:  # recorded and raised to the waiters, not swallowed
            self.starting -= 1
            self.counts["start_failures"] += 1
            self.start_error = exc
            if not self.starting:
                self._fail_waiters(exc)
            return
        self.starting -= 1
        self.counts["started"] += 1
        self.start_error = None
        self.ready_s.add(time.monotonic() - t0)
        if self.closed:
            await sandbox.close()
            return
        self._account_live(+1)
        self._offer(sandbox)
        self._replenish(need=len(self.waiters))

    async def _reset(self, sandbox) -> None:
        t0 = time.monotonic()
        try:
            await sandbox.reset()
            ok = True
        except (SandboxError, ValueError):
            ok = False  # counted as broken; the sandbox is closed and replaced
        self.resetting -= 1
        self.counts["reset"] += 1
        if ok and not self.closed:
            self.ready_s.add(time.monotonic() - t0)
            self._offer(sandbox)
        else:
            self.counts["broken"] += int(not ok)
            await self._discard(sandbox)
            self._replenish(need=len(self.waiters))

    async def _discard(self, sandbox) -> None:
        self.uses.pop(sandbox, None)
        self._account_live(-1)
        await sandbox.close()
