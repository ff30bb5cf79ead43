"""Raw ASGI helpers shared by the servers' middleware (serve, dashboard); no dependencies."""

from __future__ import annotations

import json


async def send_json(send, status: int, body: dict, headers=()) -> None:
    """Answer an ASGI HTTP request with `body` as JSON, before any app code runs."""
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data})
