"""Request limits, the API key, and the OpenAI error shape.

Every refusal is a JSON body {"error": {"message", "type", "param", "code"}} with a 4xx status;
the message names the limit and its value, and the `code` names the limit. The body-size limit
and the key check run in one ASGI middleware before any route reads the request: a body over
`max_body_bytes` (by Content-Length, or counted while it streams in) is never held in memory;
its rest is read and dropped (up to DRAIN_BYTES and DRAIN_S, or not at all when the client
waits for '100 Continue'), then it is answered 413 and the connection closed, so the client
reads the 413 instead of a reset. The concurrency limit counts requests inside the routes;
one more is answered 429 at once (clients retry 429), never queued without bound.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from traingym.core.asgi import call_with_body, send_json

DRAIN_BYTES = 64 << 20  # the most of an oversized body read (and dropped) before
DRAIN_S = 10.0  # the 413; past either bound the connection is closed unread


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    max_tokens: int = 1024  # per completion
    max_prompt_tokens: int = 4096
    max_concurrent: int = 64  # requests being answered at once
    max_n: int = 16  # completions per request


class ApiError(Exception):
    """A request the server refuses: status, message, and the OpenAI error fields."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def error_response(err: ApiError):
    from fastapi.responses import JSONResponse

    return JSONResponse(err.body(), status_code=err.status)


class Guard:
    """ASGI middleware: the API key (when set) and the body-size limit, before routing."""

    def __init__(self, app, limits: Limits, api_key: str | None):
        self.app, self.limits, self.api_key = app, limits, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None:
            auth = headers.get(b"authorization", b"").decode("latin-1")
            given = auth[7:] if auth[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(given.encode(), self.api_key.encode()):
                why = "a wrong API key" if given else "no 'Authorization: Bearer <key>' header"
                return await send_json(send, 401, ApiError(
                    401, f"this server needs an API key; the request had {why}",
                    "invalid_api_key", type_="authentication_error").body(),
                    [(b"www-authenticate", b"Bearer")])
        cap = self.limits.max_body_bytes
        too_big = ApiError(413, f"request body over the limit of {cap} bytes (max_body_bytes; "
                           "start the server with a larger --max-body-bytes)", "max_body_bytes")
        bad = ApiError(400, "Content-Length is not a number", "bad_content_length")
        return await call_with_body(self.app, scope, receive, send, headers, cap,
                                    too_big.body(), bad.body(), DRAIN_BYTES, DRAIN_S)
