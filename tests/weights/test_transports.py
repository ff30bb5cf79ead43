"""Transports over real sockets, files and processes: fan-out, late joiners, backpressure,
corruption on the wire, and every kind of death raising within a bounded time."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest
import torch

from traingym.weights import tcp
from traingym.weights.base import PeerDead, TransportTimeout
from traingym.weights.filesystem import (FilesystemConfig, FilesystemReceiver,
                                         FilesystemSender, ShmConfig, ShmReceiver, ShmSender)
from traingym.weights.frame import seal, to_views
from traingym.weights.codecs import FullCodec
from traingym.weights.hashing import state_hash
from traingym.weights.sync import Publisher, PublisherConfig, Subscriber
from traingym.weights.tcp import TcpConfig, TcpReceiver, TcpSender

torch.set_num_threads(1)
CTX = mp.get_context("spawn")


def synth_states(n: int, size: int = 200_000, density: float = 0.01, seed: int = 0):
    """bf16 states whose steps change `density` of the elements by +-1 ulp."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(size, generator=g) * 0.02).bfloat16()
    b = torch.randn(64, generator=g).bfloat16()
    out = [{"w": w.clone(), "b": b.clone()}]
    rng = np.random.default_rng(seed)
    for _ in range(n - 1):
        w16 = w.view(torch.int16).numpy()
        idx = rng.choice(size, int(size * density), replace=False)
        w16[idx] += rng.choice(np.array([-1, 1], np.int16), idx.size)
        out.append({"w": w.clone(), "b": b.clone()})
    return out


def _wait_receivers(sender: TcpSender, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while sender.n_receivers < n:
        assert time.monotonic() < deadline, f"only {sender.n_receivers} of {n} receivers"
        time.sleep(0.02)


def _subscribe(cfg, version, results, delay=0.0):
    time.sleep(delay)
    sub = Subscriber(tcp.TcpReceiver(cfg) if cfg.type == "tcp" else ShmReceiver(cfg))
    st = sub.wait_for(version, 30.0)
    results.put((os.getpid(), sub.version, state_hash(st), sub.stats.anchors))
    try:
        sub.poll(30.0)  # next: the sender's death or close must end this quickly
    except PeerDead:
        results.put("peer-dead")
    except TransportTimeout:
        results.put("timeout")


def test_tcp_fan_out_to_processes_with_a_late_joiner():
    states = synth_states(6)
    sender = TcpSender(TcpConfig())
    cfg = TcpConfig(port=sender.port)
    results = CTX.Queue()
    procs = [CTX.Process(target=_subscribe, args=(cfg, 5, results)) for _ in range(2)]
    for p in procs:
        p.start()
    _wait_receivers(sender, 2)
    pub = Publisher(sender, PublisherConfig(codec="delta"))
    for v, s in enumerate(states[:3]):
        pub.publish(s, v)
    late = CTX.Process(target=_subscribe, args=(cfg, 5, results))
    late.start()
    _wait_receivers(sender, 3)
    for v, s in enumerate(states[3:], start=3):
        pub.publish(s, v)
    got = [results.get(timeout=60) for _ in range(3)]
    assert {(g[1], g[2]) for g in got} == {(5, state_hash(states[5]))}
    sender.close()
    assert [results.get(timeout=10) for _ in range(3)] == ["peer-dead"] * 3
    for p in [*procs, late]:
        p.join(10)


def test_tcp_killed_receiver_and_stalled_receiver_do_not_stall_others():
    states = synth_states(4, size=4_000_000)  # 8 MB anchors: more than the socket buffers
    sender = TcpSender(TcpConfig(send_timeout_s=1.0))
    cfg = TcpConfig(port=sender.port, dead_after_s=5.0)
    good = Subscriber(TcpReceiver(cfg))
    victim_results = CTX.Queue()
    victim = CTX.Process(target=_subscribe, args=(cfg, 99, victim_results))
    victim.start()
    stalled = socket.create_connection(("127.0.0.1", sender.port))  # says hello, never reads
    body = json.dumps({"have": None}).encode()
    stalled.sendall(struct.pack("<4sBQ", b"TGW1", tcp.HELLO, len(body)) + body)
    _wait_receivers(sender, 3)
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    pub = Publisher(sender, PublisherConfig(codec="full"))
    t0 = time.monotonic()
    for v, s in enumerate(states):
        pub.publish(s, v)
        good.wait_for(v, 10.0)
    assert time.monotonic() - t0 < 8.0  # each stall is bounded by send_timeout_s
    assert sender.n_receivers == 1 and state_hash(good.state) == state_hash(states[-1])
    stalled.close()
    sender.close()


def _fake_sender(server: socket.socket, frames: list[bytes], then: str) -> None:
    conn, _ = server.accept()
    hdr = conn.recv(13, socket.MSG_WAITALL)  # HELLO
    conn.recv(struct.unpack("<4sBQ", hdr)[2], socket.MSG_WAITALL)
    for f in frames:
        conn.sendall(struct.pack("<4sBQ", b"TGW1", tcp.FRAME, len(f)) + f)
    if then == "die-mid-frame":
        conn.sendall(struct.pack("<4sBQ", b"TGW1", tcp.FRAME, 1 << 20) + b"x" * 1000)
        conn.close()
    elif then == "go-silent":
        time.sleep(1.5)
        conn.close()


@pytest.mark.parametrize("then", ["die-mid-frame", "go-silent"])
def test_tcp_sender_death_leaves_the_receiver_on_its_verified_version(then):
    s0 = synth_states(1)[0]
    p = FullCodec().encode(None, s0)
    import dataclasses

    p = seal(type(p)(dataclasses.replace(p.header, target_version=0,
                                         target_hash=state_hash(s0)), p.buffers))
    server = socket.create_server(("127.0.0.1", 0))
    t = threading.Thread(target=_fake_sender, args=(server, [b"".join(to_views(p))], then))
    t.start()
    sub = Subscriber(TcpReceiver(TcpConfig(port=server.getsockname()[1], dead_after_s=0.5)))
    sub.wait_for(0, 5.0)
    t0 = time.monotonic()
    with pytest.raises(PeerDead):
        sub.poll(10.0)
    assert time.monotonic() - t0 < 2.0
    assert sub.valid and sub.version == 0 and state_hash(sub.state) == state_hash(s0)
    t.join()
    server.close()


class CorruptingTcpSender(TcpSender):
    """Flips one byte on the wire in the live send of version `bad` (the chain stays good)."""

    bad = 2

    def send(self, payload):
        if payload.header.target_version != self.bad:
            return super().send(payload)
        self.chain.add(payload)
        views = [bytearray(b"".join(to_views(payload)))]
        views[0][len(views[0]) - 100] ^= 0x08
        with self.lock:
            for peer in self.peers:
                peer.push([memoryview(views[0])], None)


def test_tcp_flipped_byte_is_caught_and_resynced():
    states = synth_states(5)
    sender = CorruptingTcpSender(TcpConfig())
    sub = Subscriber(TcpReceiver(TcpConfig(port=sender.port)))
    _wait_receivers(sender, 1)
    pub = Publisher(sender, PublisherConfig(codec="delta"))
    for v, s in enumerate(states):
        pub.publish(s, v)
    sub.wait_for(4, 10.0)
    assert sub.stats.corrupt == 1 and sub.stats.resyncs >= 1
    assert state_hash(sub.state) == state_hash(states[4])
    with pytest.raises(TransportTimeout):
        sub.receiver.receive(0.2)  # alive but quiet: a timeout, not a hang
    sender.close()


def test_filesystem_publish_is_atomic_resumable_and_collected(tmp_path):
    states = synth_states(7)
    cfg = FilesystemConfig(root=str(tmp_path / "w"), dead_after_s=0.5, heartbeat_s=0.1)
    sender = FilesystemSender(cfg)
    pub = Publisher(sender, PublisherConfig(codec="delta", anchor_budget=0.05))
    early = Subscriber(FilesystemReceiver(cfg))
    for v, s in enumerate(states[:4]):
        pub.publish(s, v)
    early.wait_for(3, 5.0)
    (tmp_path / "w" / ".tmp-000000000004-delta.tgw-1").write_bytes(b"half a frame")
    with pytest.raises(TransportTimeout):
        early.poll(0.1)  # a half-written frame is never read
    for v, s in enumerate(states[4:], start=4):
        pub.publish(s, v)
    late = Subscriber(FilesystemReceiver(cfg))
    for sub in (early, late):
        sub.wait_for(6, 5.0)
        assert state_hash(sub.state) == state_hash(states[6])
    anchors = [f for f in os.listdir(tmp_path / "w") if f.endswith("full.tgw")]
    assert 1 <= len(anchors) <= 2  # older chains are collected
    sender._stop.set()  # the sender "dies": heartbeats stop, HEAD never says closed
    sender._thread.join()
    t0 = time.monotonic()
    with pytest.raises(PeerDead):
        early.poll(30.0)
    assert time.monotonic() - t0 < 2.0


def _shm_publish(name: str, n: int, ready) -> None:
    states = synth_states(n)
    pub = Publisher(ShmSender(ShmConfig(name=name)), PublisherConfig(codec="delta"))
    for v, s in enumerate(states):
        pub.publish(s, v)
    ready.set()
    time.sleep(60)  # killed by the test


def test_shm_across_processes_and_sender_death():
    name = f"test-{os.getpid()}"
    ready = CTX.Event()
    proc = CTX.Process(target=_shm_publish, args=(name, 4, ready))
    proc.start()
    assert ready.wait(60)
    sub = Subscriber(ShmReceiver(ShmConfig(name=name)))
    sub.wait_for(3, 5.0)
    assert state_hash(sub.state) == state_hash(synth_states(4)[3])
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    t0 = time.monotonic()
    with pytest.raises(PeerDead):
        sub.poll(30.0)
    assert time.monotonic() - t0 < 1.0 and sub.valid and sub.version == 3
    ShmSender.unlink(type("S", (), {"root": sub.receiver.root})())


def _reconnecting(cfg: TcpConfig) -> Subscriber:
    return Subscriber(TcpReceiver(cfg), reconnect=lambda have: TcpReceiver(cfg, have_hash=have))


def test_tcp_receiver_reconnects_to_a_restarted_sender():
    states = synth_states(4)
    first = TcpSender(TcpConfig())
    cfg = TcpConfig(port=first.port, dead_after_s=1.0, connect_timeout_s=10.0)
    sub = _reconnecting(cfg)
    _wait_receivers(first, 1)
    pub = Publisher(first, PublisherConfig(codec="delta"))
    pub.publish(states[0], 0)
    pub.publish(states[1], 1)
    sub.wait_for(1, 10.0)
    first.close()  # the trainer process restarts: a new sender, a new chain, the same port
    second = TcpSender(TcpConfig(port=cfg.port))
    pub = Publisher(second, PublisherConfig(codec="delta"))
    pub.publish(states[2], 2)  # a new publisher's first update is an anchor
    sub.wait_for(2, 10.0)
    assert state_hash(sub.state) == state_hash(states[2])
    assert sub.stats.reconnects >= 1
    pub.publish(states[3], 3)  # and deltas flow on the new connection
    sub.wait_for(3, 10.0)
    assert state_hash(sub.state) == state_hash(states[3])
    second.close()


def test_tcp_sender_gone_for_good_raises_within_the_connect_timeout():
    states = synth_states(2)
    sender = TcpSender(TcpConfig())
    sub = _reconnecting(TcpConfig(port=sender.port, dead_after_s=0.5, connect_timeout_s=1.0))
    _wait_receivers(sender, 1)
    Publisher(sender, PublisherConfig(codec="delta")).publish(states[0], 0)
    sub.wait_for(0, 10.0)
    sender.close()
    t0 = time.monotonic()
    with pytest.raises(PeerDead, match="could not reconnect"):
        while True:
            sub.poll(0.5)
    assert time.monotonic() - t0 < 5.0
    assert sub.valid and sub.version == 0 and state_hash(sub.state) == state_hash(states[0])


def test_tcp_stalled_link_serves_the_last_version_then_catches_up():
    from stall_relay import StallRelay

    states = synth_states(6)
    sender = TcpSender(TcpConfig(send_timeout_s=2.0))
    relay = StallRelay(sender.port)
    sub = _reconnecting(TcpConfig(port=relay.port, dead_after_s=1.0, connect_timeout_s=10.0))
    _wait_receivers(sender, 1)
    pub = Publisher(sender, PublisherConfig(codec="delta"))
    pub.publish(states[0], 0)
    sub.wait_for(0, 10.0)
    relay.stall()
    t0 = time.monotonic()
    for v in range(1, 5):
        pub.publish(states[v], v)  # never blocks past send_timeout_s
    assert time.monotonic() - t0 < 4 * 2.0 + 1.0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:  # the receiver notices the silence and reconnects
        with contextlib.suppress(TransportTimeout):
            sub.poll(0.2)
    assert sub.stats.reconnects >= 1
    assert sub.valid and sub.version == 0 and state_hash(sub.state) == state_hash(states[0])
    relay.flow()
    pub.publish(states[5], 5)
    sub.wait_for(5, 20.0)
    assert state_hash(sub.state) == state_hash(states[5])
    sender.close()
    relay.close()
