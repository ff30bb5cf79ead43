"""The FastAPI application: /v1/models, /v1/chat/completions, /v1/completions, /health.

Each request is checked in this order, each failure a 4xx in the OpenAI error shape naming
what is wrong: API key and body size (limits.Guard), JSON, schema (field and problem),
model name, unsupported options, n, max_tokens, prompt length, the model's context, and the
concurrency limit. Cheap checks come first, so a refusal costs no tokenizing where it can: a
prompt text longer than max_prompt_tokens x the vocabulary's longest token (in characters),
or a list of more token ids than max_prompt_tokens, is refused by its length (tokenizing a
900 KB prompt only to refuse it took 0.6 s and left ~100 MB with the allocator each time).
An error inside the engine is a 500 for that request only (batching.py, continuous.py;
mid-stream: an `error` event); the server keeps serving. The scheduler is continuous batching
with token-by-token streams where the engine declares `abilities.step_decoding`
(continuous.py, live.py), else dynamic batching (batching.py). Unknown routes and methods get
the same error shape.
"""


import asyncio
import json
import random
import time
from contextlib import asynccontextmanager

from traingym.core.types import GenerationRequest, SamplingParams
from traingym.serve import responses as R
from traingym.serve.batching import Batcher
from traingym.serve.continuous import ContinuousBatcher
from traingym.serve.limits import ApiError, Guard, Limits, error_response
from traingym.serve.live import live_sse
from traingym.serve.protocol import ChatRequest, CompletionRequest
from traingym.serve.text import render_chat


class Slots:
    """Requests being answered; one over the limit is refused (429), not queued."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def take(self) -> None:
        if self.used >= self.limit:
            raise ApiError(429, f"too many concurrent requests (max_concurrent={self.limit}); "
                           "retry shortly or start the server with a larger --max-concurrent",
                           "max_concurrent", type_="rate_limit_error")
        self.used += 1


async def _parse(request, model_cls):
    from pydantic import ValidationError

    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})", "invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the request body's JSON is nested too deeply to read",
                       "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(data).__name__}",
                       "invalid_json")
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        where = [".".join(str(p) for p in err["loc"]) for err in errs]
        text = "; ".join(f"{w or 'body'}: {err['msg']}" for w, err in zip(where, errs))
        raise ApiError(400, f"invalid request: {text}", "invalid_request",
                       where[0] if where else None) from None


def build_app(served, limits: Limits = Limits(), api_key: str | None = None):
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse
    from starlette.exceptions import HTTPException

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        await batcher.close()
        served.engine.close()

    app = FastAPI(title="traingym serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    slots, tok = Slots(limits.max_concurrent), served.tokenizer
    # no token covers more characters than the longest in the vocabulary, so a longer text
    # than this has more than max_prompt_tokens tokens, whatever its tokenization
    longest = max(map(len, tok.get_vocab()), default=1) if hasattr(tok, "get_vocab") else None
    live = served.engine.abilities.step_decoding  # continuous batching, streaming per token
    batcher = (ContinuousBatcher(served.engine, tok, served.stop_ids) if live
               else Batcher(served.engine))

    @app.exception_handler(ApiError)
    async def _api_error(request, err: ApiError):
        return error_response(err)

    @app.exception_handler(HTTPException)
    async def _http_error(request, err):
        what = "no such route" if err.status_code == 404 else err.detail
        return error_response(ApiError(err.status_code, f"{request.method} {request.url.path}: "
                                       f"{what}", "not_found" if err.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def _crash(request, err):
        return error_response(ApiError(500, f"internal error: {type(err).__name__}: {err}",
                                       "internal_error"))

    @app.get("/health")
    async def health():
        return {"ok": True, "engine": served.engine.health(), "in_flight": slots.used,
                "batching": batcher.stats}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model",
                                            "created": int(time.time()), "owned_by": "traingym"}]}

    def check(req, asked: int | None, n_prompts: int = 1):
        if req.model != served.name:
            raise ApiError(404, f"model {req.model!r} is not served here; this server serves "
                           f"{served.name!r} (GET /v1/models)", "model_not_found", "model")
        bad = req.unsupported()
        if bad:
            raise ApiError(400, f"not supported by traingym serve: {', '.join(bad)}",
                           "unsupported_parameter", bad[0].split()[0])
        if req.n * n_prompts > limits.max_n:
            raise ApiError(400, f"n={req.n} x {n_prompts} prompt(s) is over the limit of "
                           f"{limits.max_n} completions per request (max_n)", "max_n", "n")
        if asked is not None and asked > limits.max_tokens:
            raise ApiError(400, f"max_tokens={asked} is over the limit of {limits.max_tokens} "
                           "(max_tokens; the server's --max-tokens)", "max_tokens", "max_tokens")

    def tokenize(text: str, param: str) -> list[int]:
        """The ids of a prompt text; a text too long to fit is refused before tokenizing."""
        if longest and len(text) > limits.max_prompt_tokens * longest:
            raise ApiError(400, f"the prompt has {len(text)} characters, more than "
                           f"{limits.max_prompt_tokens} tokens (max_prompt_tokens) can hold: no "
                           f"token of this model is over {longest} characters; shorten it or "
                           "start the server with a larger --max-prompt-tokens",
                           "max_prompt_tokens", param)
        return tok(text, add_special_tokens=False)["input_ids"]

    def too_long(n_tokens: int, param: str = "messages") -> ApiError:
        return ApiError(400, f"the prompt has {n_tokens} tokens, over the limit of "
                        f"{limits.max_prompt_tokens} (max_prompt_tokens); shorten it or start "
                        "the server with a larger --max-prompt-tokens", "max_prompt_tokens", param)

    def sampling(req, prompt_len: int, asked: int | None, default: int, top: int):
        if prompt_len == 0:
            raise ApiError(400, "the prompt is empty", "empty_prompt", "prompt")
        if prompt_len > limits.max_prompt_tokens:
            raise too_long(prompt_len)
        room = (served.context_len - prompt_len) if served.context_len else None
        if room is not None and room < 1 or asked is not None and room is not None and asked > room:
            raise ApiError(400, f"the prompt ({prompt_len} tokens) plus max_tokens "
                           f"({asked or 1}) is over the model's context of {served.context_len} "
                           "tokens", "context_length_exceeded", "max_tokens")
        new = asked or min(default, room if room is not None else default)
        return SamplingParams(req.temperature, req.top_p, req.top_k, new, served.stop_ids, top)

    def gen_request(ids, req, params) -> GenerationRequest:
        seed = req.seed if req.seed is not None else random.getrandbits(31)
        return GenerationRequest(tuple(ids), req.n, params, seed)

    async def generate(ids, req, params):
        r = gen_request(ids, req, params)
        try:
            comps = await (batcher.submit(r, req.stop) if live else batcher.submit(r))
        except RuntimeError as e:
            raise ApiError(503, str(e), "shutting_down", type_="server_error") from None
        if params.top_logprobs and any(c.top_logprobs is None for c in comps):
            raise ApiError(400, f"this server's engine ({type(served.engine).__name__}) does not "
                           "return top log-probs; ask without top_logprobs",
                           "unsupported_parameter", "top_logprobs")
        return comps

    def stream(chunks, release):
        async def body():
            try:
                for part in chunks():
                    yield part
                    await asyncio.sleep(0)
                yield "data: [DONE]\n\n"
            finally:
                release()
        from starlette.background import BackgroundTask

        # `release` runs again after the response (once() makes that a no-op): it frees the
        # slot also when the client left before the body started
        return StreamingResponse(body(), media_type="text/event-stream",
                                 background=BackgroundTask(release))

    def stream_live(jobs, req, head, chat, logprobs, n_prompt, release):
        """Token-by-token SSE (continuous batching); 503 when shutting down."""
        if batcher.closing:
            release()
            raise ApiError(503, "the server is shutting down; it takes no new requests",
                           "shutting_down", type_="server_error")
        usage = bool(req.stream_options and req.stream_options.include_usage)
        events = live_sse(batcher, tok, jobs, req.stop, served.stop_ids, head, chat, logprobs,
                          usage, n_prompt)

        async def body():
            try:
                async for part in events:
                    yield part
            finally:
                await events.aclose()
                release()
        from starlette.background import BackgroundTask

        return StreamingResponse(body(), media_type="text/event-stream",
                                 background=BackgroundTask(release))

    def once(fn):
        done = []
        return lambda: done or (done.append(1), fn())

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req = await _parse(request, ChatRequest)
        asked = req.max_completion_tokens or req.max_tokens
        check(req, asked)
        if req.top_logprobs and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs=true", "invalid_request",
                           "top_logprobs")
        text, prefill = render_chat(tok, req)
        ids = tokenize(text, "messages")
        params = sampling(req, len(ids), asked, limits.max_tokens,
                          (req.top_logprobs or 0) if req.logprobs else 0)
        slots.take()
        release = once(lambda: setattr(slots, "used", slots.used - 1))
        use_tools = bool(req.tools) and req.tool_choice != "none"
        if req.stream and live and not use_tools:
            head = {"id": R.new_id("chatcmpl"), "object": "chat.completion.chunk",
                    "created": int(time.time()), "model": served.name}
            return stream_live([(gen_request(ids, req, params), 0)], req, head, True,
                               req.logprobs, len(ids), release)
        try:
            comps = await generate(ids, req, params)
            choices = [R.make_choice(tok, i, c, req.stop, served.stop_ids, use_tools, prefill)
                       for i, c in enumerate(comps)]
        except BaseException:
            release()
            raise
        if not req.stream:
            release()
            return R.chat_body(tok, served.name, choices, len(ids), req.logprobs)
        head = {"id": R.new_id("chatcmpl"), "object": "chat.completion.chunk",
                "created": int(time.time()), "model": served.name}

        def chunks():
            for c in choices:
                yield R.sse({**head, "choices": [{"index": c.index, "finish_reason": None,
                                                  "delta": {"role": "assistant", "content": ""}}]})
                yield from R.chat_chunks(tok, head, c, req.logprobs)
            if req.stream_options and req.stream_options.include_usage:
                yield R.sse({**head, "choices": [], "usage": R.usage(len(ids), choices)})
        return stream(chunks, release)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await _parse(request, CompletionRequest)
        p = req.prompt
        prompts = [p] if isinstance(p, str) or isinstance(p[0], int) else p
        check(req, req.max_tokens, len(prompts))
        for x in prompts:  # token ids: refused by their count before they are scanned
            if not isinstance(x, str) and len(x) > limits.max_prompt_tokens:
                raise too_long(len(x), "prompt")
        all_ids = [list(x) if not isinstance(x, str) else tokenize(x, "prompt") for x in prompts]
        vocab = len(tok)
        if any(not 0 <= i < vocab for ids in all_ids for i in ids):
            raise ApiError(400, f"prompt token ids must be in [0, {vocab})", "invalid_token_id",
                           "prompt")
        params = [sampling(req, len(ids), req.max_tokens, 16, req.logprobs or 0)
                  for ids in all_ids]
        slots.take()
        release = once(lambda: setattr(slots, "used", slots.used - 1))
        if req.stream and live:
            head = {"id": R.new_id("cmpl"), "object": "text_completion",
                    "created": int(time.time()), "model": served.name}
            jobs = [(gen_request(ids, req, sp), k * req.n)
                    for k, (ids, sp) in enumerate(zip(all_ids, params))]
            return stream_live(jobs, req, head, False, req.logprobs is not None,
                               sum(len(ids) for ids in all_ids), release)
        try:
            results = await asyncio.gather(*(generate(ids, req, sp)
                                             for ids, sp in zip(all_ids, params)))
            choices = [R.make_choice(tok, k * req.n + j, c, req.stop, served.stop_ids)
                       for k, comps in enumerate(results) for j, c in enumerate(comps)]
        except BaseException:
            release()
            raise
        n_prompt = sum(len(ids) for ids in all_ids)
        logprobs = req.logprobs is not None
        if not req.stream:
            release()
            return R.completion_body(tok, served.name, choices, n_prompt, logprobs)
        head = {"id": R.new_id("cmpl"), "object": "text_completion",
                "created": int(time.time()), "model": served.name}

        def chunks():
            for c in choices:
                yield from R.completion_chunks(tok, head, c, logprobs)
            if req.stream_options and req.stream_options.include_usage:
                yield R.sse({**head, "choices": [], "usage": R.usage(n_prompt, choices)})
        return stream(chunks, release)

    return Guard(app, limits, api_key)
