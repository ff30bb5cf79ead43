"""Sandboxes on other machines, as the code that runs them sees a local pool.

On a Ray cluster with `cluster.sandbox_workers` (cluster/ray_sandboxes.py) the sandboxes run
in worker actors on CPU nodes, not beside the engines. An engine process installs the
workers' client here once (`install`); `pool_for` in envs/code_env.py then hands out that
client instead of a local pool, so an env's code is the same on a laptop and on a cluster.
The client has the pool's `session()` / `exec()` shape: a session holds one sandbox on one
worker for its whole length (so a multi-step session keeps its files), and each call is one
round trip. This module imports no Ray; the client comes from the cluster code.
"""

from __future__ import annotations

from typing import Any

_client: Any = None


def install(client: Any) -> None:
    """Route this process's sandbox pools to `client` (None: back to local pools)."""
    global _client
    _client = client


def current() -> Any:
    """The installed client, or None when sandboxes run in this process's own pools."""
    return _client
