"""Dynamic batching between HTTP requests and an engine without `abilities.step_decoding`
(vLLM, SGLang, an OpenAI endpoint, plugins); the built-in engine uses serve/continuous.py.

One task takes everything queued and hands it to the engine as one `generate` call; calls run
one at a time (an engine is not assumed to take concurrent calls). Requests differing only in
max_tokens decode together at the longest and are cut back, which is exact because a
completion's first k tokens do not depend on how many follow (rollout/base.py seeding). A call
that raises is retried request by request so one bad request fails alone.
Not covered: rows joining a batch between decode steps, priorities beyond arrival order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from traingym.core.types import Completion, GenerationRequest


class Batcher:
    def __init__(self, engine):
        self.engine = engine
        self.queue: list[tuple[GenerationRequest, asyncio.Future]] = []
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.closing = False
        self.stats = {"mode": "dynamic", "engine_calls": 0, "requests": 0,
                      "max_requests_per_call": 0,
                      "engine_seconds": 0.0, "failed_calls": 0}

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def submit(self, request: GenerationRequest) -> list[Completion]:
        if self.closing or self.task is None or self.task.done():
            raise RuntimeError("the server is shutting down; it takes no new requests")
        fut = asyncio.get_running_loop().create_future()
        self.queue.append((request, fut))
        self.wake.set()
        return await fut

    async def _loop(self) -> None:
        while not (self.closing and not self.queue):
            if not self.queue:
                self.wake.clear()
                await self.wake.wait()
                continue
            batch, self.queue = self.queue, []
            live = [(r, f) for r, f in batch if not f.done()]  # cancelled while queued: skip
            if live:
                await self._run(live)

    async def _run(self, batch) -> None:
        t0 = time.perf_counter()
        self.stats["engine_calls"] += 1
        self.stats["requests"] += len(batch)
        self.stats["max_requests_per_call"] = max(self.stats["max_requests_per_call"], len(batch))
        try:
            results = await self.engine.generate(merge_lengths([r for r, _ in batch]))
        except Exception as e:
            self.stats["failed_calls"] += 1
            if len(batch) == 1:
                _settle(batch[0][1], error=e)
            else:
                for one in batch:  # find the request that fails; answer the others
                    await self._run([one])
            return
        finally:
            self.stats["engine_seconds"] += time.perf_counter() - t0
        for (r, fut), comps in zip(batch, results):
            _settle(fut, [cut(c, r.params.max_new_tokens) for c in comps])

    async def close(self) -> None:
        """Answer everything queued, then stop."""
        self.closing = True
        self.wake.set()
        if self.task is not None:
            await self.task


def _settle(fut: asyncio.Future, result=None, error: Exception | None = None) -> None:
    if fut.done():  # the client went away
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def merge_lengths(requests: list[GenerationRequest]) -> list[GenerationRequest]:
    """Each request with the longest max_new_tokens among those whose other sampling
    parameters equal its own, so the engine decodes them as one batch."""
    longest: dict = {}
    for r in requests:
        key = dataclasses.replace(r.params, max_new_tokens=0)
        longest[key] = max(longest.get(key, 0), r.params.max_new_tokens)
    return [dataclasses.replace(r, params=dataclasses.replace(
        r.params, max_new_tokens=longest[dataclasses.replace(r.params, max_new_tokens=0)]))
        for r in requests]


def cut(c: Completion, n: int) -> Completion:
    """`c` cut back to its first `n` tokens (finish_reason 'length' where anything was cut)."""
    if len(c.token_ids) <= n:
        return c
    versions = c.token_versions[:n] if c.token_versions else None
    return dataclasses.replace(
        c, token_ids=c.token_ids[:n], logprobs=c.logprobs[:n], finish_reason="length",
        token_versions=versions if versions and versions[0] != versions[-1] else None,
        top_logprobs=c.top_logprobs[:n] if c.top_logprobs is not None else None)
