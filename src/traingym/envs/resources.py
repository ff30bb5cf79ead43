"""Resources an env keeps for the whole run on the rollout event loop (a warm sandbox pool, a
connection), closed when the runner that owns the loop closes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

_CLOSERS: dict[asyncio.AbstractEventLoop, list[Callable[[], Awaitable[None]]]] = {}


def on_loop_close(close: Callable[[], Awaitable[None]]) -> None:
    """Register `await close()` to run when the current event loop's runner closes."""
    _CLOSERS.setdefault(asyncio.get_running_loop(), []).append(close)


async def close_loop_resources() -> None:
    """Run (in registration order) and forget the closers of the current loop."""
    for close in _CLOSERS.pop(asyncio.get_running_loop(), []):
        await close()
