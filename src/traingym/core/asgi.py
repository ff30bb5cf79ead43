"""Raw ASGI helpers shared by the servers' middleware (serve, dashboard, tinker); no deps."""

from __future__ import annotations

import asyncio
import json


async def send_json(send, status: int, body: dict, headers=()) -> None:
    """Answer an ASGI HTTP request with `body` as JSON, before any app code runs."""
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data})


async def discard_body(receive, max_bytes: int, max_s: float) -> bool:
    """Read the rest of a request body and drop it, so that a refusal sent next reaches the
    client: a server that closes with request bytes unread makes the kernel reset the
    connection, and the client (still sending) sees a reset, not the answer. True when the
    body ended within `max_bytes` and `max_s`; False on a disconnect or past either bound."""
    seen = 0
    try:
        async with asyncio.timeout(max_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return False
                seen += len(message.get("body", b""))
                if not message.get("more_body"):
                    return True
                if seen > max_bytes:
                    return False
    except TimeoutError:
        return False


async def call_with_body(app, scope, receive, send, headers: dict, cap: int, too_big: dict,
                         bad_length: dict, drain_bytes: int, drain_s: float):
    """Call `app` with the request's whole body read first, at most `cap` bytes, so a route
    reads it from memory. A Content-Length that is not a number is answered 400 `bad_length`;
    a body declared or sent over `cap`, 413 `too_big` with the connection closed (its rest read
    and dropped first, up to `drain_bytes` and `drain_s`, unless the client waits for '100
    Continue' and so has sent nothing). A disconnect while reading: None, the app not called."""
    try:
        declared = int(headers.get(b"content-length", b"0"))
    except ValueError:
        return await send_json(send, 400, bad_length)
    if declared > cap:
        if headers.get(b"expect", b"").lower() != b"100-continue" and declared <= drain_bytes:
            await discard_body(receive, drain_bytes, drain_s)
        return await send_json(send, 413, too_big, [(b"connection", b"close")])
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > cap:
            chunks.clear()
            if message.get("more_body"):
                await discard_body(receive, drain_bytes - size, drain_s)
            return await send_json(send, 413, too_big, [(b"connection", b"close")])
        if not message.get("more_body"):
            break
    body, sent = b"".join(chunks), False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then wait for the disconnect, as the server reports it

    return await app(scope, replay, send)
