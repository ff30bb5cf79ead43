"""Raw ASGI helpers shared by the servers' middleware (serve, dashboard); no dependencies."""

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
