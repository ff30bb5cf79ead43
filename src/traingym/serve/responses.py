"""OpenAI response bodies and server-sent-event chunks from finished engine completions.

Log-probs are the engine's (rollout/base.py): softmax(logits / T) before top-k/top-p, raw when
greedy. The end-of-turn token is not listed but counts in usage. A byte-piece token is written
`bytes:\\xNN` as OpenAI does, with raw `bytes` (models/token_strings.py), so every token maps
back to its id. Token-by-token streams of the built-in engine are serve/live.py's.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from traingym.models.token_strings import token_str, token_utf8
from traingym.serve import text as T


@dataclass
class Choice:
    index: int
    text: str
    pieces: list[str]  # one per kept token
    ids: list[int]
    logprobs: list[float]
    tops: list[list[tuple[int, float]]] | None
    finish_reason: str
    n_tokens: int  # for usage: kept tokens plus the end-of-turn token
    content: str | None = None
    tool_calls: list[dict] | None = None


def make_choice(tok, index, comp, stops, stop_ids, tools: bool = False, prefill: str = ""):
    text, kept, reason, pieces = T.finish(tok, comp.token_ids, comp.finish_reason, stops,
                                          stop_ids)
    eos = int(reason == "stop" and kept < len(comp.token_ids) and
              comp.token_ids[kept] in stop_ids and kept == len(comp.token_ids) - 1)
    c = Choice(index, text, pieces, comp.token_ids[:kept], comp.logprobs[:kept],
               comp.top_logprobs[:kept] if comp.top_logprobs is not None else None,
               reason, kept + eos, content=text)
    if tools:
        content, calls = T.tool_calls(prefill + text)
        if calls:
            c.content, c.finish_reason = content, "tool_calls"
            c.tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                             "function": call} for call in calls]
    return c


def usage(prompt_tokens: int, choices: list[Choice]) -> dict:
    done = sum(c.n_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": done,
            "total_tokens": prompt_tokens + done}


def _entry(tok, i: int, lp: float) -> dict:
    return {"token": token_str(tok, i), "logprob": lp, "bytes": token_utf8(tok, i)}


def chat_logprobs(tok, c: Choice, lo: int = 0, hi: int | None = None) -> dict:
    out = []
    for j in range(lo, len(c.ids) if hi is None else hi):
        e = _entry(tok, c.ids[j], c.logprobs[j])
        e["top_logprobs"] = [_entry(tok, t, lp) for t, lp in c.tops[j]] if c.tops else []
        out.append(e)
    return {"content": out}


def completion_logprobs(tok, c: Choice, lo: int = 0, hi: int | None = None,
                        offset: int = 0) -> dict:
    hi = len(c.ids) if hi is None else hi
    toks = [token_str(tok, i) for i in c.ids[lo:hi]]
    tops = [{token_str(tok, t): lp for t, lp in c.tops[j]}
            if c.tops else {} for j in range(lo, hi)]
    offsets, pos = [], offset
    for p in c.pieces[lo:hi]:
        offsets.append(pos)
        pos += len(p)
    return {"tokens": toks, "token_logprobs": c.logprobs[lo:hi], "top_logprobs": tops,
            "text_offset": offsets}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def chat_body(tok, model: str, choices: list[Choice], prompt_tokens: int, logprobs: bool) -> dict:
    out = []
    for c in choices:
        msg = {"role": "assistant", "content": c.content}
        if c.tool_calls:
            msg["tool_calls"] = c.tool_calls
        out.append({"index": c.index, "message": msg, "finish_reason": c.finish_reason,
                    "logprobs": chat_logprobs(tok, c) if logprobs else None})
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": out, "usage": usage(prompt_tokens, choices)}


def completion_body(tok, model: str, choices: list[Choice], prompt_tokens: int,
                    logprobs: bool) -> dict:
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
            "model": model, "usage": usage(prompt_tokens, choices), "choices": [
                {"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
                 "logprobs": completion_logprobs(tok, c) if logprobs else None}
                for c in choices]}


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def chat_chunks(tok, head: dict, c: Choice, logprobs: bool):
    """The chunks of one choice after its role chunk: content per token (or the tool calls
    at once), then its finish_reason."""
    def chunk(delta, lp=None, finish=None):
        return sse({**head, "choices": [{"index": c.index, "delta": delta, "logprobs": lp,
                                         "finish_reason": finish}]})
    if c.tool_calls:
        if c.content:
            yield chunk({"content": c.content})
        yield chunk({"tool_calls": [{"index": k, **tc} for k, tc in enumerate(c.tool_calls)]})
    else:
        for j, piece in enumerate(c.pieces):
            yield chunk({"content": piece},
                        chat_logprobs(tok, c, j, j + 1) if logprobs else None)
    yield chunk({}, finish=c.finish_reason)


def completion_chunks(tok, head: dict, c: Choice, logprobs: bool):
    pos = 0
    for j, piece in enumerate(c.pieces):
        lp = completion_logprobs(tok, c, j, j + 1, pos) if logprobs else None
        pos += len(piece)
        yield sse({**head, "choices": [{"index": c.index, "text": piece, "logprobs": lp,
                                        "finish_reason": None}]})
    yield sse({**head, "choices": [{"index": c.index, "text": "", "logprobs": None,
                                    "finish_reason": c.finish_reason}]})
