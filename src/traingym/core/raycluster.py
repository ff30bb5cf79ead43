"""Joining a Ray cluster from the driver: shared by the engine actors (cluster/ray.py) and the
trainer's rank actors (trainer/ray_ranks.py). Imports ray: import it only on the Ray path."""

from __future__ import annotations

import ray


def join_cluster(cluster) -> bool:
    """Connect this driver to `cluster.address` with `cluster.py_modules` shipped, unless it
    is connected already; True when this call connected (the caller then shuts Ray down)."""
    if ray.is_initialized():
        return False
    runtime_env = {"py_modules": list(cluster.py_modules)} if cluster.py_modules else None
    ray.init(address=cluster.address, runtime_env=runtime_env, log_to_driver=True)
    return True
