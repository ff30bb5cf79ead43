"""Checks of `cluster` that run before any work (before the model loads), so a Ray run with
no `ray` package or an address nobody listens on fails in a second, not after minutes.

Covered: ray importable; for a 'host:port' (or 'ray://host:port') address, that a TCP
connection to it opens within a few seconds. Not covered: 'auto' (Ray resolves it itself),
and whether what listens there is a Ray head of a compatible version (ray.init says).
"""

from __future__ import annotations

import importlib.util
import socket

from traingym.cluster.config import ClusterConfig
from traingym.core.errors import ConfigError


def check_cluster(cluster: ClusterConfig, timeout_s: float = 5.0) -> None:
    if cluster.type != "ray":
        return
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("cluster.type='ray' needs the ray package: pip install "
                          "'traingym[ray]'")
    address = cluster.address.removeprefix("ray://")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return  # 'auto' or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:  # refused, unreachable, unknown host, timed out
        raise ConfigError(f"cluster.address={cluster.address!r}: cannot connect ({e}); is the "
                          "Ray head running there (`ray start --head` prints its address)?") \
            from None
