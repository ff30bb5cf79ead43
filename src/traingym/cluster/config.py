"""The `async` and `cluster` config sections: engine processes and where they run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from traingym.core.errors import Strict


class AsyncConfig(Strict):
    """Disaggregated mode (`mode: async`, loop/async_loop.py): engines in their own processes
    stream scored groups to the trainer while it trains, within a bound on staleness.
    """

    max_staleness: int = Field(1, ge=0, description="a group is trained on at step s only if "
                               "every policy token came from version >= s - max_staleness; "
                               "older groups are dropped and counted, never trained on")
    queue_size: int = Field(0, ge=0, description="groups dispatched to engines and not yet "
                            "consumed (in flight or scored and waiting); 0: (max_staleness + 1)"
                            " x rollout.prompts_per_step")
    recycle: bool = Field(True, description="a dropped (too stale) group's prompt is sampled "
                          "again; False: it is skipped and the next prompt is taken")
    engines: int = Field(1, ge=1, description="rollout engine processes (Ray actors with "
                         "cluster.type='ray')")
    engine_timeout_s: float = Field(120.0, gt=0, description="an engine that delivers nothing "
                                    "this long while work is outstanding fails the run")
    inflight_updates: bool = Field(False, description="engines apply new weights between "
                                   "decode steps too, not only between engine calls; each "
                                   "token records the version that sampled it")
    restarts: int = Field(0, ge=0, description="engine processes that may be restarted after "
                          "dying (their in-flight prompts are dispatched again); past that the "
                          "run fails")


class ClusterConfig(Strict):
    """Where the engines, the trainer's ranks 1.. (trainer.data_parallel) and the sandbox
    workers run (cluster/): local processes, or actors on a Ray cluster (cluster/ray.py,
    trainer/ray_ranks.py, cluster/ray_sandboxes.py; needs the `ray` extra and mode='async').
    `traingym tinker` reads it too: with type='ray' its sampling engines are actors
    (cluster/ray_sampler.py)."""

    type: Literal["local", "ray"] = Field("local", description="local: engine processes on "
                                          "this machine; ray: engine actors on a Ray cluster")
    address: str | None = Field(None, description="ray: the cluster to join (host:port of its "
                                "head, or 'auto'); required with type='ray'")
    engine_resources: dict[str, float] = Field(
        default_factory=dict, description="ray: extra resources each engine's placement-group "
        "bundle asks for, beside one CPU (a custom node resource pins engines to those nodes)")
    py_modules: list[str] = Field(default_factory=list, description="ray: local package "
                                  "folders shipped to every engine (runtime_env py_modules): "
                                  "the user's reward and env code not installed on the nodes")
    sandbox_workers: int = Field(0, ge=0, description="ray: sandbox worker actors (one CPU "
                                 "each) that run the envs' sandboxed code on CPU nodes; 0: "
                                 "sandboxes run inside each engine (cluster/ray_sandboxes.py)")
    sandbox_resources: dict[str, float] = Field(
        default_factory=dict, description="ray: extra resources each sandbox worker asks for "
        "(a custom resource of the CPU nodes keeps them off the engines' nodes)")
    trainer_resources: dict[str, float] = Field(
        default_factory=dict, description="ray: extra resources each trainer rank actor "
        "(ranks 1.. of trainer.data_parallel) asks for beside one CPU; rank 0 is the driver")

    @model_validator(mode="after")
    def _ray_only(self) -> ClusterConfig:
        if self.type == "ray" and not self.address:
            raise ValueError("cluster.type='ray' needs cluster.address (the head's host:port, "
                             "or 'auto')")
        if self.type == "local" and (self.address or self.engine_resources or self.py_modules
                                     or self.sandbox_workers or self.sandbox_resources
                                     or self.trainer_resources):
            raise ValueError("cluster.address, engine_resources, py_modules, "
                             "trainer_resources and sandbox_* apply only with "
                             "cluster.type='ray'")
        if self.sandbox_resources and not self.sandbox_workers:
            raise ValueError("cluster.sandbox_resources needs cluster.sandbox_workers > 0")
        return self
