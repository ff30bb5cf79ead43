"""Sandbox workers on CPU nodes of a Ray cluster (`cluster.sandbox_workers`, mode='async').

Code execution scales with the rollout rate, not with the GPUs, so it belongs on cheap CPU
nodes. `start_workers` places N `SandboxWorker` actors (one CPU plus
`cluster.sandbox_resources`), each keeping warm pools (sandbox/pool.py) on its node. Each engine
gets a `RemoteSandboxes` client in its run resources (envs/resources.py), which opens each
session on the worker holding the fewest of its sessions. A worker that dies fails its sessions
with a SandboxError naming it.
Not covered: restarting a dead worker, moving sessions between workers, pools shared across
workers, releasing the sessions of an engine that died mid-session (held until the run ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from traingym.sandbox import Limits, SandboxError, open_sandbox
from traingym.sandbox.pool import SandboxPool


@ray.remote
class SandboxWorker:
    """Warm sandbox pools on one node; sessions opened and used by remote calls (async)."""

    def __init__(self, min_ready: int, max_size: int):
        self.min_ready, self.max_size = min_ready, max_size
        self.pools: dict[tuple[str, Limits], SandboxPool] = {}
        self.sessions: dict[int, tuple[SandboxPool, object]] = {}
        self.ids = itertools.count()
        self.served = 0

    def where(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    async def open(self, backend: str, limits: Limits) -> int:
        key = (backend, limits)
        if key not in self.pools:
            self.pools[key] = SandboxPool(lambda: open_sandbox(backend, limits),
                                          min_ready=self.min_ready, max_size=self.max_size)
        pool = self.pools[key]
        sandbox = await pool.acquire()
        sid = next(self.ids)
        self.sessions[sid] = (pool, sandbox)
        self.served += 1
        return sid

    async def exec(self, sid: int, command, stdin: bytes, files, limits):
        return await self.sessions[sid][1].exec(command, stdin=stdin, files=files,
                                                limits=limits)

    async def release(self, sid: int) -> None:
        pool, sandbox = self.sessions.pop(sid)
        await pool.release(sandbox)

    def stats(self) -> dict:
        return {**self.where(), "sessions": self.served, "open": len(self.sessions),
                "pools": {backend: p.stats() for (backend, _), p in self.pools.items()}}

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()


class _RemoteSession:
    def __init__(self, worker, sid: int):
        self.worker, self.sid = worker, sid

    async def exec(self, command, *, stdin: bytes = b"", files=None, limits=None):
        return await _call(self.worker, self.worker.exec, self.sid, command, stdin, files,
                           limits)


async def _call(worker, method, *args):
    try:  # the engine's event loop runs in a thread of its actor: wait on Ray's future
        return await asyncio.wrap_future(method.remote(*args).future())
    except ray.exceptions.RayActorError as e:
        raise SandboxError(f"sandbox worker {worker} is gone: {e}") from e


class _RemotePool:
    """One backend and limits on the workers, with SandboxPool's session()/exec() shape."""

    def __init__(self, client: RemoteSandboxes, backend: str, limits: Limits):
        self.client, self.backend, self.limits = client, backend, limits

    @contextlib.asynccontextmanager
    async def session(self):
        c = self.client
        i = min(range(len(c.workers)), key=c.open.__getitem__)
        worker = c.workers[i]
        c.open[i] += 1
        try:
            sid = await _call(worker, worker.open, self.backend, self.limits)
            try:
                yield _RemoteSession(worker, sid)
            finally:
                with contextlib.suppress(SandboxError):
                    await _call(worker, worker.release, sid)
        finally:
            c.open[i] -= 1

    async def exec(self, command, *, stdin: bytes = b"", files=None, limits=None):
        async with self.session() as sandbox:
            return await sandbox.exec(command, stdin=stdin, files=files, limits=limits)


class RemoteSandboxes:
    """The engines' client of the sandbox workers (picklable: it holds actor handles)."""

    def __init__(self, workers: list):
        self.workers = workers
        self.open = [0] * len(workers)  # sessions this client holds, per worker

    def pool(self, backend: str, limits: Limits) -> _RemotePool:
        return _RemotePool(self, backend, limits)


def start_workers(n: int, resources: dict[str, float], timeout_s: float,
                  min_ready: int = 2, max_size: int = 8):
    """Place n sandbox workers; return (placement group, workers, their nodes)."""
    bundle = {"CPU": 1.0, **resources}
    pg = placement_group([dict(bundle)] * n, strategy="SPREAD")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise TimeoutError(f"Ray could not place {n} sandbox worker bundles of {bundle} within "
                           f"{timeout_s}s: the cluster has {ray.available_resources()} free")
    workers = [SandboxWorker.options(
        num_cpus=1, resources=dict(resources),
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
    ).remote(min_ready, max_size) for i in range(n)]
    nodes = ray.get([w.where.remote() for w in workers], timeout=timeout_s)
    return pg, workers, nodes


def close_workers(workers, timeout_s: float = 30.0) -> list[dict]:
    """Close every worker's pools; return their last stats (a dead worker's: its error)."""
    out = []
    for w in workers:
        try:
            out.append(ray.get(w.stats.remote(), timeout=timeout_s))
            ray.get(w.close.remote(), timeout=timeout_s)
        except ray.exceptions.RayError as e:
            out.append({"error": str(e)})
        ray.kill(w, no_restart=True)
    return out
