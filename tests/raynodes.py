"""Ray nodes for tests, started on this machine by `ray start --block` in their own session
(separate ports and temp dirs) and stopped by process id, never `ray stop`: shared by
tests/cluster/test_ray.py (two nodes) and tests/tinker/test_ray_sampling.py (one)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

RAY = shutil.which("ray", path=str(Path(sys.executable).parent))


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _node_cmd(temp, ports, resources=None):
    node_manager, object_manager, w_lo, agent, metrics, rt_agent, agent_grpc = ports
    cmd = [RAY, "start", "--block", "--num-cpus=1", f"--temp-dir={temp}",
           "--object-store-memory=100000000", "--memory=3000000000",
           f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}",
           f"--min-worker-port={w_lo}", f"--max-worker-port={w_lo + 20}",
           f"--dashboard-agent-listen-port={agent}", f"--metrics-export-port={metrics}",
           f"--runtime-env-agent-port={rt_agent}", f"--dashboard-agent-grpc-port={agent_grpc}"]
    if resources:
        cmd.append(f"--resources={resources}")
    return cmd


def _stop(proc, temp):
    """Stop one node: the `ray start --block` process, its children and any process whose
    command line names this node's temp dir; by process id, SIGTERM then SIGKILL."""
    import psutil

    mine = set()
    try:
        root = psutil.Process(proc.pid)
        mine |= {root, *root.children(recursive=True)}
    except psutil.NoSuchProcess:
        pass
    for p in psutil.process_iter(["cmdline"]):
        if any(str(temp) in part for part in (p.info["cmdline"] or [])):
            mine.add(p)
    for p in mine:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(list(mine), timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def _wait_for(address, n, nodes, timeout=90.0):
    """Until the cluster lists n live nodes (`ray status` against this head only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc, _ in nodes:
            assert proc.poll() is None, f"ray start exited with {proc.returncode}"
        out = subprocess.run([RAY, "status", f"--address={address}"], capture_output=True,
                             text=True, env={**os.environ})
        if out.returncode == 0 and out.stdout.count("node_") >= n:
            return
        time.sleep(1.0)
    raise TimeoutError(f"the Ray cluster at {address} did not list {n} nodes in {timeout}s:\n"
                       f"{out.stdout}\n{out.stderr}")
