"""Continuous batching for engines with `abilities.step_decoding` (the built-in engine's fused
path): requests join the running batch between decode steps and leave when they finish.

One loop retires rows of requests that went away, admits waiting ones in arrival order within
free rows and PREFILL_TOKENS (so a burst of long prompts does not stall live rows), and runs one
decode step (rollout/continuous.py StepDecoder) in a worker thread. Tokens stream to each
request through serve/text.py TextStream; a stop string ends its row at once.
Errors stay local: a failed prefill fails its request, a failed decode step fails the live
requests and rebuilds the decoder, a request's own callback error fails only it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from traingym.core.types import Completion, GenerationRequest
from traingym.serve.text import TextStream

PREFILL_TOKENS = 8192  # padded prompt tokens prefilled in one tick (one prompt at least)


@dataclass
class Handle:
    """One request in the batcher: its rows, what they made so far, its result future."""

    request: GenerationRequest
    stops: list[str]
    on_event: Callable | None
    future: asyncio.Future
    rows: list[int] = field(default_factory=list)
    made: list[dict] = field(default_factory=list)  # per sample: ids, lps, tops, versions
    texts: list[TextStream | None] = field(default_factory=list)
    left: int = 0  # samples not finished
    cancelled: bool = False


class ContinuousBatcher:
    def __init__(self, engine, tok, stop_ids: tuple[int, ...] = ()):
        self.engine, self.tok, self.stop_ids = engine, tok, stop_ids
        self.decoder = engine.step_decoder()
        self.waiting: list[Handle] = []
        self.by_row: dict[int, tuple[Handle, int]] = {}
        self.to_retire: set[int] = set()
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.closing = False
        self.stats = {"mode": "continuous", "steps": 0, "requests": 0, "admissions": 0,
                      "max_live_rows": 0, "live_rows": 0, "engine_seconds": 0.0,
                      "failed_steps": 0, "retired_early": 0}

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop())

    def open(self, request: GenerationRequest, stops: list[str] | None = None,
             on_event: Callable | None = None) -> Handle:
        if self.closing or self.task is None or self.task.done():
            raise RuntimeError("the server is shutting down; it takes no new requests")
        h = Handle(request, list(stops or []), on_event,
                   asyncio.get_running_loop().create_future())
        self.waiting.append(h)
        self.stats["requests"] += 1
        self.wake.set()
        return h

    async def submit(self, request: GenerationRequest, stops: list[str] | None = None
                     ) -> list[Completion]:
        h = self.open(request, stops)
        try:
            return await asyncio.shield(h.future)
        except asyncio.CancelledError:
            self.cancel(h)
            raise

    def cancel(self, h: Handle) -> None:
        """The client went away: drop the request (its rows leave before the next step)."""
        if h.future.done():
            return
        h.cancelled = True
        h.future.cancel()
        if h in self.waiting:
            self.waiting.remove(h)
        self.to_retire.update(h.rows)
        for row in h.rows:  # tokens it still gets from a step in flight are dropped
            self.by_row.pop(row, None)
        self.wake.set()

    async def _loop(self) -> None:
        while not (self.closing and not self.waiting and not self.by_row):
            if not self.waiting and not self.by_row and not self.to_retire:
                self.wake.clear()
                await self.wake.wait()
                continue
            admit, free, width = [], self.decoder.free(), 0
            while self.waiting:
                r = self.waiting[0].request
                alone = not admit and not self.by_row
                fits = r.n <= free and (not admit or PREFILL_TOKENS >= (len(admit) + 1)
                                        * max(width, len(r.prompt_ids)))
                if not (alone or fits):
                    break
                admit.append(self.waiting.pop(0))
                free, width = free - r.n, max(width, len(r.prompt_ids))
            retire, self.to_retire = list(self.to_retire), set()
            t0 = time.perf_counter()
            try:
                rows, errors, tokens = await asyncio.to_thread(self._tick, admit, retire)
            except Exception as e:  # the decode step failed: fail what is live, go on
                self.stats["failed_steps"] += 1
                live = {id(h): h for h, _ in self.by_row.values()}
                for h in [*live.values(), *admit]:
                    _fail(h, e)
                self.by_row.clear()
                self.decoder = self.engine.step_decoder()
                continue
            finally:
                self.stats["engine_seconds"] += time.perf_counter() - t0
            for h, ids in zip(admit, rows):
                if ids is None:
                    _fail(h, errors[id(h)])
                    continue
                try:
                    self._joined(h, ids)
                except Exception as e:  # this request's bookkeeping failed: it alone fails
                    self._drop(h, e)
            for t in tokens:
                h = self.by_row[t.row][0] if t.row in self.by_row else None
                try:
                    self._token(t)
                except Exception as e:  # e.g. its stream's callback or text decoding raised
                    if h is not None:
                        self._drop(h, e)
            self.stats["steps"] += bool(tokens)
            self.stats["live_rows"] = self.decoder.live
            self.stats["max_live_rows"] = max(self.stats["max_live_rows"], len(tokens))

    def _tick(self, admit: list[Handle], retire: list[int]):
        """In the worker thread: retire, admit (one prefill for all; one by one if it
        fails, so a bad request fails alone), one step."""
        self.decoder.retire(retire)
        rows: list = [None] * len(admit)
        errors = {}
        if admit:
            try:
                rows = self.decoder.admit([h.request for h in admit])
            except Exception as e:
                if len(admit) == 1:
                    errors[id(admit[0])] = e
                else:
                    for i, h in enumerate(admit):
                        try:
                            rows[i] = self.decoder.admit([h.request])[0]
                        except Exception as e1:
                            errors[id(h)] = e1
        return rows, errors, self.decoder.step()

    def _drop(self, h: Handle, e: Exception) -> None:
        """Fail one request whose bookkeeping raised, and free its rows; the others go on."""
        try:
            _fail(h, e)
        except Exception:  # its stream's callback raised again; its future holds the error
            pass
        h.cancelled = True
        self.to_retire.update(h.rows)
        for row in h.rows:
            self.by_row.pop(row, None)

    def _joined(self, h: Handle, ids: list[int]) -> None:
        self.stats["admissions"] += 1
        h.rows, h.left = ids, len(ids)
        if h.cancelled:  # went away during its prefill
            self.to_retire.update(ids)
            return
        stream = h.on_event is not None or h.stops
        for k, row in enumerate(ids):
            self.by_row[row] = (h, k)
            h.made.append({"ids": [], "lps": [], "tops": [], "versions": []})
            h.texts.append(TextStream(self.tok, h.stops, self.stop_ids) if stream else None)

    def _token(self, t) -> None:
        if t.row not in self.by_row:
            return
        h, k = self.by_row[t.row]
        m = h.made[k]
        m["ids"].append(t.token)
        m["lps"].append(t.logprob)
        m["tops"].append(t.top)
        m["versions"].append(t.version)
        reason, text = t.finish_reason, h.texts[k]
        new, released = "", []
        if text is not None:
            new, released = text.feed(t.token)
            if text.stopped:  # a stop string: the row ends here
                if reason is None:
                    self.to_retire.add(t.row)
                    self.stats["retired_early"] += 1
                reason = "stop"
            elif reason is not None and text.finish_reason is None:
                more, rel = text.end(reason)
                new, released = new + more, released + rel
        if h.on_event is not None and not h.cancelled and (new or released or reason):
            h.on_event(k, new, released, reason)
        if reason is None:
            return
        m["reason"] = reason
        del self.by_row[t.row]
        h.left -= 1
        if h.left == 0 and not h.future.done():
            h.future.set_result([_completion(h.request, m) for m in h.made])

    async def close(self) -> None:
        """Answer everything admitted or waiting, then stop."""
        self.closing = True
        self.wake.set()
        if self.task is not None:
            await self.task


def _fail(h: Handle, e: Exception) -> None:
    if not h.future.done():
        h.future.set_exception(e)
    if h.on_event is not None and not h.cancelled:
        h.on_event(None, "", [], e)


def _completion(r: GenerationRequest, m: dict) -> Completion:
    v = m["versions"]
    tops = m["tops"] if r.params.top_logprobs > 0 else None
    return Completion(tuple(r.prompt_ids), m["ids"], m["lps"], m["reason"], v[0],
                      v if v[0] != v[-1] else None, tops)
