"""torch.distributed transport with gloo over 3 CPU processes: broadcast, a resync round,
and a rank that dies making the sender raise instead of hang."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import socket
import time

import numpy as np
import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _states(n: int):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(100_000, generator=g) * 0.02).bfloat16()
    rng = np.random.default_rng(0)
    out = [{"w": w.clone()}]
    for _ in range(n - 1):
        w.view(torch.int16).numpy()[rng.choice(w.numel(), 1000, replace=False)] += 1
        out.append({"w": w.clone()})
    return out


def _rank(rank: int, world: int, port: int, results, die_rank: int | None) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist

    from traingym.weights.base import PeerDead
    from traingym.weights.dist import DistConfig, DistReceiver, DistSender
    from traingym.weights.hashing import state_hash
    from traingym.weights.sync import Publisher, PublisherConfig, Subscriber

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10))
    states = _states(5)
    if rank == 0:
        pub = Publisher(DistSender(DistConfig(bucket_bytes=64 << 10)),
                        PublisherConfig(codec="delta"))
        for v in range(3):
            pub.publish(states[v], v)
        t0 = time.monotonic()
        try:
            for v in range(3, 5):
                pub.publish(states[v], v)
            results.put(("sender", "ok", time.monotonic() - t0))
        except PeerDead:
            results.put(("sender", "peer-dead", time.monotonic() - t0))
        return
    sub = Subscriber(DistReceiver(DistConfig(bucket_bytes=64 << 10)))
    for v in range(3):
        sub.wait_for(v, 30)
    if rank == 1:
        sub.receiver.resync(None)  # as after a failed verification: the chain comes again
    if rank == die_rank:
        results.put((rank, sub.version, state_hash(sub.state)))
        results.close()
        results.join_thread()  # flush before dying without cleanup
        os._exit(0)
    try:
        sub.wait_for(4, 30)
    except PeerDead:  # a collective group fails as a whole when one rank dies
        results.put((rank, "peer-dead", sub.version))
        return
    results.put((rank, sub.version, state_hash(sub.state)))
    dist.destroy_process_group()


def _run(die_rank):
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 3, port, results, die_rank)) for r in range(3)]
    for p in procs:
        p.start()
    out = [results.get(timeout=45) for _ in range(3)]
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    return out


def test_gloo_broadcast_with_a_resync_round():
    from traingym.weights.hashing import state_hash

    out = _run(die_rank=None)
    want = state_hash(_states(5)[4])
    assert sorted(o for o in out if o[0] != "sender") == [(1, 4, want), (2, 4, want)]
    assert [o[1] for o in out if o[0] == "sender"] == ["ok"]


def test_gloo_dead_rank_makes_the_sender_raise():
    out = _run(die_rank=2)
    sender = [o for o in out if o[0] == "sender"][0]
    assert sender[1] == "peer-dead" and sender[2] < 15.0
    assert (1, "peer-dead", 2) in out  # the survivor raises too and keeps version 2
