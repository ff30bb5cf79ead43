"""Worker ranks of the data-parallel trainer as Ray actors (`cluster.type = "ray"`).

Rank 0 stays in the driver; ranks 1..W-1 are actors in one PACK placement group, a bundle each
of one CPU plus `cluster.trainer_resources`, each running the same RankServer as a local worker
process. Rendezvous is a TCPStore on the driver's node IP; gloo then connects every pair of
ranks directly, so the nodes must reach each other (set GLOO_SOCKET_IFNAME where the default
interface is not the shared one). The driver joins the cluster here if it has not yet and shuts
the connection down when the trainer closes, after the engines.
Not covered: GPUs (bundles ask for CPU only), restarting a dead rank (the run fails; resume it
from its last checkpoint).
"""

from __future__ import annotations

import dataclasses
import os

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from traingym.core.raycluster import join_cluster
from traingym.trainer.rank import RankServer, RankSpec, describe


@ray.remote
class RankActor:
    def __init__(self, spec: RankSpec, rank: int):
        self.server, self.error = None, None
        if spec.trace_node not in (None, ray.get_runtime_context().get_node_id()):
            spec = dataclasses.replace(spec, trace_dir=None)  # not this node's: ship spans
        try:
            self.server = RankServer(spec, rank)
        except Exception as e:  # answered by started(), with the cause
            self.error = describe(e)

    def started(self):
        if self.error is not None:
            return "error", self.error
        return "ok", {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def call(self, cmd: str, arg):
        return self.server.handle(cmd, arg)


class ActorRank:
    """Rank 0's handle on one rank actor, with ProcessRank's send/reply/kill."""

    def __init__(self, actor, rank: int):
        self.actor, self.rank, self.pid, self.node = actor, rank, None, None
        self.pending = actor.started.remote()

    def send(self, cmd: str, arg) -> None:
        self.pending = self.actor.call.remote(cmd, arg)

    def reply(self, timeout: float):
        try:
            kind, value = ray.get(self.pending, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            return "silent", f"no answer within {timeout:.0f}s"
        except ray.exceptions.RayActorError as e:
            return "dead", f"actor died: {e}"
        return kind, value

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)

    def wait_exit(self, timeout: float) -> None:
        self.kill()


class RayPlacement:
    def __init__(self, cluster, timeout_s: float):
        self.cluster, self.timeout_s, self.pg = cluster, timeout_s, None
        self.owns_ray = join_cluster(cluster)
        self.host = ray.util.get_node_ip_address()
        self.driver_node = ray.get_runtime_context().get_node_id()

    def start(self, spec: RankSpec) -> list[ActorRank]:
        bundle = {"CPU": 1.0, **self.cluster.trainer_resources}
        n = spec.world - 1
        self.pg = placement_group([dict(bundle)] * n, strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=self.timeout_s)
        if not ready:
            raise TimeoutError(f"Ray could not place {n} trainer rank bundles of {bundle} "
                               f"within {self.timeout_s}s (trainer.dist_timeout_s): the "
                               f"cluster has {ray.available_resources()} free")
        custom = {k: v for k, v in bundle.items() if k != "CPU"}
        return [ActorRank(RankActor.options(
                    num_cpus=1, resources=custom,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.pg, placement_group_bundle_index=r - 1)).remote(spec, r), r)
                for r in range(1, spec.world)]

    def release(self) -> None:
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None
        if self.owns_ray:
            ray.shutdown()
            self.owns_ray = False
