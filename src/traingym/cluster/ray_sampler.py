"""One rollout engine as a Ray actor that serves plain generate calls, for a caller that keeps
the weights in its own process (the Tinker server's samplers with `cluster.type = "ray"`,
tinker/sampling.py).

The actor builds its engine from an EngineContext the project's way (rollout.registry.build,
as engine_process.py does) and takes weights only through the weight-sync Subscriber over tcp,
hash-verified, as async mode's engine actors (cluster/ray.py) do; its built weights are never
served. The caller's side (`RaySampler`) joins the cluster (core/raycluster.py), holds the
Publisher (an anchor, then deltas against the last version with the delta codec) and returns
from `publish` once the actor applied that version. `report` reads back the hash of what the
engine holds, to compare with the publisher's.
Not covered: several actors per engine, restarts (a dead actor fails the calls that follow),
engines on GPUs (the actor asks for one CPU plus cluster.engine_resources).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

import ray

from traingym.core.precision import engine_dtype
from traingym.core.raycluster import join_cluster
from traingym.core.registry import restore, snapshot
from traingym.models.loader import load_policy
from traingym.rollout import registry as engines
from traingym.rollout.base import UNSERVED
from traingym.rollout.context import EngineContext
from traingym.weights import registry
from traingym.weights.sync import Publisher, PublisherConfig, Subscriber, SubscriberConfig


@ray.remote
class SamplerActor:
    """The engine, its subscriber, and the calls the caller makes on it."""

    def __init__(self, ctx: EngineContext, cls: type, transport, receiver: type, threads: int,
                 timeout_s: float, registries: dict, prepare: Callable | None):
        restore(registries)  # names the caller's process registered
        model, tok = load_policy(ctx.model, seed=ctx.seed)
        self.engine, _ = engines.build(ctx, model, tok, cls)
        del model
        if prepare is not None:
            prepare(self.engine)
        self.engine.version = UNSERVED
        self.subscriber = Subscriber(receiver(transport), SubscriberConfig(threads=threads))
        self.timeout_s = timeout_s

    def where(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def apply(self, version: int) -> int:
        """Wait for `version` (verified), then put it into the engine."""
        state = self.subscriber.wait_for(version, self.timeout_s)
        self.engine.update_weights(state, self.subscriber.version)
        return self.engine.version

    def generate(self, requests: list) -> list:
        return self.engine.generate_sync(requests)

    def call(self, fn: Callable, *args) -> Any:
        """`fn(engine, *args)` here (a module-level function: it travels by reference)."""
        return fn(self.engine, *args)

    def report(self) -> dict:
        return {"version": self.engine.version, "hash": self.engine.state_hash()}


class RaySampler:
    """The caller's side of one SamplerActor: `publish(state)`, then `generate(requests)`.

    `cluster` is a ClusterConfig (type 'ray'), `weights` a WeightsConfig whose transport
    crosses nodes (tcp), `scratch` a folder the transport may use. `prepare(engine)` runs in
    the actor after the engine is built (a module-level function)."""

    def __init__(self, ctx: EngineContext, cluster, weights, scratch: Path,
                 prepare: Callable | None = None):
        entry = registry.get(weights.transport)
        if not entry.abilities.crosses_nodes:
            raise ValueError(f"weights.transport={weights.transport!r} does not reach Ray "
                             f"actors on other nodes; choose one of "
                             f"{registry.able('crosses_nodes')}")
        self.owns_ray = join_cluster(cluster)
        self.dtype, self.timeout_s = engine_dtype(ctx.dtype), weights.timeout_s
        self.scratch = scratch
        if scratch.exists():
            shutil.rmtree(scratch)
        sync = registry.SyncContext(scratch, f"sampler-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                                    ray.util.get_node_ip_address())
        transport, self.sender = registry.open_sender(weights.transport, weights, sync)
        self.publisher = Publisher(self.sender, PublisherConfig(weights.codec,
                                                                weights.anchor_budget,
                                                                threads=weights.threads))
        self.version = 0
        try:
            self.actor = SamplerActor.options(num_cpus=1, resources=dict(
                cluster.engine_resources)).remote(
                ctx, engines.get(ctx.engine), transport, entry.receiver, weights.threads,
                weights.timeout_s, snapshot(), prepare)
            self.where = ray.get(self.actor.where.remote(), timeout=weights.timeout_s)
        except BaseException:
            self.close()
            raise

    def publish(self, state: dict) -> int:
        """Send `state` (the engine's tensor names; cast to the engine's dtype on the way) as
        the next version; return it once the actor serves it."""
        self.version += 1
        applied = self.actor.apply.remote(self.version)  # it reads while we send
        self.publisher.publish({k: v.detach().contiguous() for k, v in state.items()},
                               self.version, cast=self.dtype)
        return ray.get(applied, timeout=self.timeout_s)

    def generate(self, requests: list) -> list:
        return ray.get(self.actor.generate.remote(requests))

    def call(self, fn: Callable, *args) -> Any:
        return ray.get(self.actor.call.remote(fn, *args))

    def report(self) -> dict:
        """The engine's version and weights hash, with the hash of the last published
        version (`published`): equal when the engine holds exactly what was sent."""
        return {**ray.get(self.actor.report.remote(), timeout=self.timeout_s),
                "published": self.publisher.full_hash()}

    def close(self) -> None:
        try:
            if hasattr(self, "actor"):
                ray.kill(self.actor, no_restart=True)
            self.sender.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
        finally:
            if self.owns_ray:
                ray.shutdown()
