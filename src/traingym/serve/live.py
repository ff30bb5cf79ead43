"""Server-sent events as tokens are made (continuous batching, serve/continuous.py).

Each choice gets a chunk when its text grows (serve/text.py TextStream), then one with its
finish_reason; choices of one request interleave; usage and `data: [DONE]` follow the last. An
engine error mid-stream is sent as an `error` event. A client that goes away has its rows leave
the batch before the next decode step.
Not streamed live: chat with tools (the parse needs the whole answer; serve/responses.py).
"""

from __future__ import annotations

import asyncio

from traingym.core.types import GenerationRequest
from traingym.serve import responses as R


async def live_sse(batcher, tok, jobs: list[tuple[GenerationRequest, int]], stops: list[str],
                   stop_ids, head: dict, chat: bool, logprobs: bool, usage: bool,
                   prompt_tokens: int):
    """SSE strings for `jobs` (request, index of its first choice)."""
    queue: asyncio.Queue = asyncio.Queue()
    handles = []
    try:
        for request, base in jobs:
            h = batcher.open(request, stops)
            h.on_event = lambda k, new, rel, fin, h=h, base=base: queue.put_nowait(
                (h, base, k, new, rel, fin))
            handles.append(h)
            if chat:
                for k in range(request.n):
                    yield R.sse({**head, "choices": [{"index": base + k, "finish_reason": None,
                                 "delta": {"role": "assistant", "content": ""}}]})
        pending = sum(r.n for r, _ in jobs)
        while pending:
            h, base, k, new, rel, fin = await queue.get()
            if isinstance(fin, Exception):
                yield R.sse({"error": {"message": f"internal error: {type(fin).__name__}: "
                                                  f"{fin}", "type": "server_error",
                                       "code": "internal_error"}})
                return
            index = base + k
            if new or rel:
                lp = _logprobs(tok, h, k, rel, chat) if logprobs else None
                if chat:
                    yield R.sse({**head, "choices": [{"index": index, "delta": {"content": new},
                                                      "logprobs": lp, "finish_reason": None}]})
                else:
                    yield R.sse({**head, "choices": [{"index": index, "text": new,
                                                      "logprobs": lp, "finish_reason": None}]})
            if fin is not None:
                pending -= 1
                end = {"index": index, "logprobs": None, "finish_reason": fin}
                yield R.sse({**head, "choices": [{**end, "delta": {}} if chat else
                                                 {**end, "text": ""}]})
        if usage:
            choices = [R.make_choice(tok, 0, c, stops, stop_ids)
                       for h in handles for c in await h.future]
            yield R.sse({**head, "choices": [], "usage": R.usage(prompt_tokens, choices)})
        yield "data: [DONE]\n\n"
    finally:  # done, or the client went away (this generator is closed or cancelled)
        for h in handles:
            batcher.cancel(h)
            if h.future.done() and not h.future.cancelled():
                h.future.exception()  # retrieved (an error was sent as an event)


def _logprobs(tok, h, k: int, released: list[int], chat: bool) -> dict:
    m, text = h.made[k], h.texts[k]
    c = R.Choice(0, "", [text.piece(i) for i in released], [m["ids"][i] for i in released],
                 [m["lps"][i] for i in released],
                 [m["tops"][i] for i in released] if m["tops"] and m["tops"][0] is not None
                 else None, "", 0)
    if chat:
        return R.chat_logprobs(tok, c)
    return R.completion_logprobs(tok, c, offset=text.start(released[0]) if released else 0)
