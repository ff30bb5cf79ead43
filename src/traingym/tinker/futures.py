"""Futures: every mutating call is answered at once with a request id; the work runs later.

One worker thread runs all compute, first in first out, so torch has the machine's cores to
itself and nothing races on a model. Work for a training client is ordered by the `seq_id` the
SDK stamps on each request (1, 2, 3, ... per client, in the order the user's script called
them): a request that arrives before its predecessor (the SDK sends the chunks of one
forward_backward in parallel, the first one last) waits until the gap is filled, as the SDK
expects ("missing reserved ids cannot be skipped by the server"). Sampling requests carry no
order and go straight to the worker.

A result is kept until `kept` newer ones have finished (oldest dropped first), so a client may
retrieve futures in any order and retrieve one again. An exception in the work fails that
future only ('user' category for a `UserError`, else 'server'); the worker keeps serving.
Sample requests of one sampling session that are queued together run as one batch
(`submit_batched`): they have no order among them, and the engine decodes them at once.

A batched request may name a `target` (a sampling session and its clone number): its id is
then also logged, in finish order, in that target's completion log, which `completions`
long-polls with a cursor (the SDK's /retrieve_futures session poller). A log keeps at most
`kept` entries; the entries a poll acknowledges (cursor) are trimmed.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import traceback
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_BATCH = 64  # requests one batched call takes


class UserError(ValueError):
    """A request that cannot run as asked: the future fails with category 'user'."""


@dataclass
class Outcome:
    """A finished future: a JSON-able dict, protobuf bytes, or an error."""

    json: dict | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "server"


@dataclass(order=True)
class _Queued:
    seq: int
    n: int
    rid: str = field(compare=False)
    fn: Callable | None = field(compare=False)  # None: a refused request's place
    key: object = field(compare=False, default=None)  # batched with queued items of this key
    payload: object = field(compare=False, default=None)


class Lane:
    """One training client's order: requests run by seq_id, each after its predecessor."""

    def __init__(self, first: int = 1):
        self.next = first
        self.held: list[_Queued] = []


class Futures:
    def __init__(self, kept: int = 4096, max_pending: int = 1024):
        self.kept, self.max_pending = kept, max_pending
        self.done: OrderedDict[str, Outcome] = OrderedDict()
        self.pending: dict[str, asyncio.Event] = {}
        self.work: deque[_Queued | None] = deque()
        self.ready = threading.Condition()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()
        self.count = itertools.count()
        self.thread: threading.Thread | None = None
        self.target_of: dict[str, object] = {}  # request id -> its target (see completions)
        self.logs: dict[object, deque[tuple[int, str]]] = {}  # target -> (cursor, id)
        self.news: dict[object, asyncio.Event] = {}  # target -> set when its log grows
        self.cursor = itertools.count(1)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread = threading.Thread(target=self._run, name="tinker-worker", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread is not None:
            self._put(None)
            self.thread.join(timeout=30)
            self.thread = None

    def busy(self) -> bool:
        """As many requests queued or running as `max_pending`: refuse more (429)."""
        return len(self.pending) - len(self.done) >= self.max_pending

    def submit(self, fn: Callable[[], Outcome | dict | bytes], lane: Lane | None = None,
               seq: int | None = None) -> str:
        """Queue `fn` (run on the worker thread) and return its request id at once. With a
        `lane`, `fn` runs after the lane's requests with smaller `seq`."""
        rid = uuid.uuid4().hex
        self.pending[rid] = asyncio.Event()
        item = _Queued(seq if seq is not None else 0, next(self.count), rid, fn)
        with self.lock:
            if lane is None:
                self._put(item)
                return rid
            if seq is None or seq < lane.next:
                raise UserError(f"seq_id {seq} was already used by this training client "
                                f"(next expected: {lane.next})")
            heapq.heappush(lane.held, item)
            self._release(lane)
        return rid

    def skip(self, lane: Lane, seq: int | None) -> None:
        """A request refused before queueing still uses its seq_id (the SDK does not send it
        again), so the lane's later requests do not wait for it."""
        with self.lock:
            if seq is not None and seq >= lane.next:
                heapq.heappush(lane.held, _Queued(seq, next(self.count), "", None))
                self._release(lane)

    def _release(self, lane: Lane) -> None:
        while lane.held and lane.held[0].seq <= lane.next:
            item = heapq.heappop(lane.held)
            if item.seq == lane.next:
                lane.next += 1
            if item.fn is not None:
                self._put(item)

    def submit_batched(self, key, payload, run_many: Callable[[list], list],
                       target=None) -> str:
        """Queue `payload`; when the worker reaches it, every queued payload with the same
        `key` (up to MAX_BATCH) runs in one `run_many(payloads)` call, which returns one result
        (or exception) per payload. For requests with no order among them (samples of one
        sampling session): running them together lets the engine decode them as one batch."""
        rid = uuid.uuid4().hex
        self.pending[rid] = asyncio.Event()
        if target is not None:
            with self.lock:
                self.target_of[rid] = target
                self.logs.setdefault(target, deque(maxlen=self.kept))
        self._put(_Queued(0, next(self.count), rid, run_many, key, payload))
        return rid

    def _put(self, item: _Queued | None) -> None:
        with self.ready:
            self.work.append(item)
            self.ready.notify()

    def _take(self) -> list[_Queued] | None:
        with self.ready:
            while not self.work:
                self.ready.wait()
            item = self.work.popleft()
            if item is None:
                return None
            batch = [item]
            if item.key is not None:
                for other in list(self.work):
                    if len(batch) == MAX_BATCH:
                        break
                    if other is not None and other.key == item.key:
                        self.work.remove(other)
                        batch.append(other)
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            if batch[0].key is None:
                self._store(batch[0].rid, _outcome(batch[0].fn))
                continue
            try:
                results = batch[0].fn([item.payload for item in batch])
            except Exception as e:  # the whole call failed: each of its requests fails
                results = [e] * len(batch)
            for item, result in zip(batch, results, strict=True):
                self._store(item.rid, _outcome(lambda r=result: _raise_or(r)))

    def _store(self, rid: str, outcome: Outcome) -> None:
        with self.lock:
            self.done[rid] = outcome
            while len(self.done) > self.kept:
                old, _ = self.done.popitem(last=False)
                self.pending.pop(old, None)
                self.target_of.pop(old, None)
            target = self.target_of.get(rid)
            if target in self.logs:
                self.logs[target].append((next(self.cursor), rid))
        event = self.pending.get(rid)
        if event is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(event.set)
            news = self.news.get(target)  # (the loop's thread may drop it meanwhile)
            if news is not None:
                self.loop.call_soon_threadsafe(news.set)

    def drop_target(self, target) -> None:
        """Forget a target's log (its sampling session ended); its results stay until
        dropped as usual."""
        with self.lock:
            self.logs.pop(target, None)
        event = self.news.pop(target, None)
        if event is not None:
            event.set()  # a poll waiting on it answers (with nothing)

    async def completions(self, target, prev_cursor: int, timeout: float,
                          retrieved: list[str] = ()) -> tuple[list[tuple[str, Outcome]], int]:
        """Requests of `target` finished after `prev_cursor` (its entries up to it are
        trimmed), waiting up to `timeout` s for the first, with the cursor to pass next.
        `retrieved`: ids of this target whose results the client has, dropped now (ids that
        are not this target's, not finished, or gone already, are left alone). KeyError: no
        such target."""
        def ready():
            with self.lock:
                log = self.logs[target]
                while log and log[0][0] <= prev_cursor:
                    log.popleft()
                for rid in retrieved:  # finished ones only: a pending one is not retrieved
                    if self.target_of.get(rid) == target and rid in self.done:
                        self.target_of.pop(rid)
                        self.done.pop(rid, None)
                        self.pending.pop(rid, None)
                return [(c, rid, self.done.get(rid)) for c, rid in log]

        found = ready()
        if not found and timeout > 0:
            event = self.news.setdefault(target, asyncio.Event())
            event.clear()
            found = ready()
            if not found:
                try:
                    await asyncio.wait_for(event.wait(), timeout)
                except TimeoutError:
                    pass
                found = ready() if target in self.logs else []
        cursor = max([c for c, _, _ in found], default=prev_cursor)
        return [(rid, out) for _, rid, out in found if out is not None], cursor

    async def wait(self, rid: str, timeout: float) -> Outcome | None:
        """The outcome, or None when it is not ready within `timeout` s; KeyError: unknown."""
        with self.lock:
            if rid in self.done:
                return self.done[rid]
        event = self.pending[rid]  # KeyError: no such request (or long dropped)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return None
        return self.done.get(rid)


def _raise_or(result):
    if isinstance(result, Exception):
        raise result
    return result


def _outcome(fn: Callable) -> Outcome:
    """Run `fn`; its result or its exception as an Outcome."""
    try:
        result = fn()
    except UserError as e:
        return Outcome(error=str(e), category="user")
    except Exception as e:  # the request fails; the worker keeps serving
        traceback.print_exception(e)
        return Outcome(error=f"{type(e).__name__}: {e}", category="server")
    if isinstance(result, Outcome):
        return result
    if isinstance(result, bytes):
        return Outcome(proto=result)
    return Outcome(json=result)
