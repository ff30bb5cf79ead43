"""Rollout engines as Ray actors (`cluster: {type: ray, address: ...}`, mode='async').

The trainer stays in the driver process, which joins the cluster at `cluster.address`; the
engines are actors in one placement group, a bundle per engine of one CPU plus
`cluster.engine_resources`. Each actor runs engine_main (cluster/engine_process.py) in a thread,
its weights over tcp from the driver's node. `RayEngines` is LocalEngines with `_spawn`
overridden (each actor behind the Process/Queue interface), so the ledger, restarts and checks
are LocalEngines'. Rewards and envs travel pickled by reference: the nodes must import them
(an installed package or `cluster.py_modules`). `cluster.sandbox_workers` places sandbox
workers first (cluster/ray_sandboxes.py).
Not covered: trainer rank 0 as an actor, transports that do not cross nodes, engines on GPUs
(bundles ask for CPU only), a driver the engines' nodes cannot reach directly.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections import deque

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from traingym.cluster.engine_process import EngineSpec, engine_main
from traingym.cluster.local import EngineError, EnginesSetup, LocalEngines
from traingym.cluster.ray_sandboxes import RemoteSandboxes, close_workers, start_workers
from traingym.core.raycluster import join_cluster


class _ThreadQueue(queue.Queue):
    """The result queue inside an actor. engine_main flushes a multiprocessing queue with
    close() and join_thread() before exiting on an error; a thread queue holds its items
    in memory, so there is nothing to flush and both return at once."""

    def close(self) -> None:
        return None

    def join_thread(self) -> None:
        return None


@ray.remote(concurrency_groups={"requests": 1, "results": 1})
class EngineActor:
    """One rollout engine: engine_main in a thread, fed and drained by remote calls."""

    def __init__(self, spec: EngineSpec):
        if spec.trace_node not in (None, ray.get_runtime_context().get_node_id()):
            spec = dataclasses.replace(spec, trace_dir=None)  # not this node's: ship spans
        self.requests, self.results = queue.Queue(), _ThreadQueue()
        self.thread = threading.Thread(target=engine_main,
                                       args=(spec, self.requests, self.results), daemon=True)
        self.thread.start()

    def where(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    @ray.method(concurrency_group="requests")
    def put(self, msg) -> None:
        self.requests.put(msg)

    @ray.method(concurrency_group="results")
    def take(self, timeout: float) -> tuple[list, bool]:
        """Messages waiting (up to `timeout` for the first), and whether the engine ended."""
        out = []
        try:
            out.append(self.results.get(timeout=timeout))
            while True:
                out.append(self.results.get_nowait())
        except queue.Empty:
            pass
        return out, not self.thread.is_alive() and self.results.empty()


class _ActorEngine:
    """An engine actor as LocalEngines sees a process and its two queues: put() is the
    request queue, get() the result queue; exitcode turns non-None (1) once the engine's
    thread has ended and its messages are all read, or -9 when the actor is gone."""

    def __init__(self, actor, timeout_s: float):
        self.actor, self.buffer, self.exitcode = actor, deque(), None
        try:
            where = ray.get(actor.where.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError as e:  # e.g. the node cannot unpickle the reward
            raise EngineError(f"a rollout engine actor failed to start: {e}") from e
        self.pid, self.node = where["pid"], where["node"]

    def put(self, msg) -> None:
        self.actor.put.remote(msg)

    def get(self, timeout: float):
        if not self.buffer and self.exitcode is None:
            try:
                msgs, ended = ray.get(self.actor.take.remote(timeout))
            except ray.exceptions.RayActorError as e:
                self.exitcode = -9
                raise EOFError(f"engine actor (pid {self.pid}) is gone: {e}") from e
            self.buffer.extend(msgs)
            if ended:
                self.exitcode = 1
        if not self.buffer:
            raise queue.Empty
        return self.buffer.popleft()

    def cancel_join_thread(self) -> None:
        """Nothing to cancel: put() hands each message to Ray at once."""
        return None

    def join(self, timeout: float) -> None:
        """Wait until the engine's thread has ended (the driver's pump reads its end)."""
        deadline = time.monotonic() + timeout
        while self.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)
        self.exitcode = -9


class RayEngines(LocalEngines):
    def __init__(self, setup: EnginesSetup, start_version: int):
        c = setup.cluster
        self.owns_ray = join_cluster(c)
        self.tcp_host = ray.util.get_node_ip_address()
        self.trainer_node = self.trace_node = ray.get_runtime_context().get_node_id()
        self.bundle = {"CPU": 1.0, **c.engine_resources}
        timeout = setup.async_.engine_timeout_s
        self.pg = placement_group([dict(self.bundle)] * setup.async_.engines, strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=timeout)
        if not ready:
            self._release()
            raise TimeoutError(f"Ray could not place {setup.async_.engines} engine bundles "
                               f"of {self.bundle} within {timeout}s (async.engine_timeout_s): "
                               f"the cluster has {ray.available_resources()} free")
        self.sandbox_workers, self.sandbox_nodes = [], []
        try:
            if c.sandbox_workers:
                self.sandbox_pg, self.sandbox_workers, self.sandbox_nodes = start_workers(
                    c.sandbox_workers, c.sandbox_resources, timeout)
            super().__init__(setup, start_version)
        except BaseException:
            self._release()
            raise

    def _spawn(self, eid: int, spec: EngineSpec):
        if self.sandbox_workers:
            spec = dataclasses.replace(spec, sandboxes=RemoteSandboxes(self.sandbox_workers))
        if eid < len(self.handles):  # a restart: the predecessor's actor frees its bundle
            self.handles[eid].proc.kill()
        strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=eid)
        custom = {k: v for k, v in self.bundle.items() if k != "CPU"}
        actor = EngineActor.options(num_cpus=1, resources=custom,
                                    scheduling_strategy=strategy).remote(spec)
        engine = _ActorEngine(actor, self.acfg.engine_timeout_s)
        return engine, engine, engine

    def verify_final(self) -> list[dict]:
        reports = super().verify_final()
        if self.sandbox_workers:  # where the envs' code ran, and how much of it
            self.stats["sandbox_workers"] = ray.get(
                [w.stats.remote() for w in self.sandbox_workers],
                timeout=self.acfg.engine_timeout_s)
        return [{**r, "node": self.handles[r["engine"]].proc.node,
                 "trainer_node": self.trainer_node} for r in reports]

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release()

    def _release(self) -> None:
        if getattr(self, "sandbox_workers", None):
            close_workers(self.sandbox_workers)
            self.sandbox_workers = []
        if hasattr(self, "sandbox_pg"):
            remove_placement_group(self.sandbox_pg)
        if hasattr(self, "pg"):
            remove_placement_group(self.pg)
        if self.owns_ray:
            ray.shutdown()
