"""TCP transport: one sender fans out to many receivers, chunked and streaming.

Messages are `b"TGW1" | u8 kind | u64 length | body`. The sender runs a writer and a
reader thread per receiver. `send` returns once every live receiver's socket took the whole
frame (backpressure: the publisher is never more than one frame ahead of its slowest
receiver); a receiver that takes longer than `send_timeout_s` is dropped and the others go
on. A receiver says HELLO on connect and RESYNC when it needs to, each with the hash it
holds; the sender answers with the chain after that hash, or from the last anchor. Idle
senders send heartbeats; a receiver that hears nothing for `dead_after_s`, or sees the
connection close (also mid-frame), raises PeerDead; a partial frame is discarded.
A receiver that lost its sender may connect again with the hash it holds (a Subscriber made
with `reconnect` does, weights/sync.py); a sender restarted on the same port answers with an
anchor, as its chain is new. Not covered: TLS or auth (bind to loopback or a private network).
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass

from traingym.weights.base import Payload, PeerDead, TransportTimeout
from traingym.weights.frame import from_buffer, to_views
from traingym.weights.registry import Abilities, Transport
from traingym.weights.chain import Chain

_HDR = struct.Struct("<4sBQ")
_MAGIC = b"TGW1"
FRAME, HEARTBEAT, HELLO, RESYNC, BYE = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class TcpConfig:
    type: str = "tcp"
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port (read it back from TcpSender.port)."""
    connect_timeout_s: float = 10.0
    send_timeout_s: float = 60.0
    heartbeat_s: float = 0.5
    dead_after_s: float = 5.0
    chunk_bytes: int = 4 << 20
    max_pending: int = 8
    """Frames a receiver buffers; past that it stops reading, which throttles the sender."""
    max_frame_bytes: int = 1 << 40


def _send_msg(sock: socket.socket, kind: int, views, chunk: int) -> None:
    total = sum(v.nbytes for v in views)
    sock.sendall(_HDR.pack(_MAGIC, kind, total))
    for v in views:
        for off in range(0, v.nbytes, chunk):
            sock.sendall(v[off : off + chunk])


def _recv_into(sock: socket.socket, buf, on_bytes) -> None:
    mv, got = memoryview(buf), 0
    while got < len(mv):
        n = sock.recv_into(mv[got:], min(len(mv) - got, 4 << 20))
        if n == 0:
            raise PeerDead(f"connection closed after {got} of {len(mv)} bytes")
        got += n
        on_bytes()


def _shutdown(sock: socket.socket) -> None:
    """Wake any thread blocked on the socket, then close it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed or reset by the other side
        pass
    sock.close()


class _Peer:
    def __init__(self, owner: TcpSender, sock: socket.socket) -> None:
        self.owner, self.sock = owner, sock
        self.cond = threading.Condition()
        self.outbox: deque[tuple[list[memoryview], threading.Event | None]] = deque()
        self.alive, self.joined = True, False
        sock.settimeout(owner.cfg.send_timeout_s)
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def push(self, views, done: threading.Event | None) -> None:
        with self.cond:
            self.outbox.append((views, done))
            self.cond.notify()

    def kill(self) -> None:
        with self.cond:
            self.alive = False
            for _, done in self.outbox:
                if done is not None:
                    done.set()
            self.outbox.clear()
            self.cond.notify()
        _shutdown(self.sock)

    def _read(self) -> None:
        hdr = bytearray(_HDR.size)
        while self.alive:
            try:
                if not select.select([self.sock], [], [], 1.0)[0]:
                    continue  # receivers speak rarely; the socket's timeout is for writes
                _recv_into(self.sock, hdr, lambda: None)
                magic, kind, n = _HDR.unpack(hdr)
                if magic != _MAGIC or kind not in (HELLO, RESYNC) or n > 1 << 16:
                    break
                body = bytearray(n)
                _recv_into(self.sock, body, lambda: None)
            except (OSError, ValueError, PeerDead):
                break
            self.owner._replay(self, json.loads(body)["have"])
        self.owner._drop(self)

    def _write(self) -> None:
        cfg = self.owner.cfg
        while True:
            with self.cond:
                if not self.outbox and self.alive:
                    self.cond.wait(cfg.heartbeat_s)
                if not self.alive:
                    return
                item = self.outbox.popleft() if self.outbox else None
            try:
                if item is None:
                    _send_msg(self.sock, HEARTBEAT, [], cfg.chunk_bytes)
                    continue
                _send_msg(self.sock, FRAME if item[0] else BYE, item[0], cfg.chunk_bytes)
            except OSError:
                self.owner._drop(self)
                return
            finally:
                if item is not None and item[1] is not None:
                    item[1].set()


class TcpSender:
    def __init__(self, cfg: TcpConfig = TcpConfig()) -> None:
        self.cfg, self.chain = cfg, Chain()
        self.lock = threading.Lock()
        self.peers: list[_Peer] = []
        self.server = socket.create_server((cfg.host, cfg.port))
        self.port = self.server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _Peer(self, sock)

    def _replay(self, peer: _Peer, have: str | None) -> None:
        with self.lock:  # ordered with send: the replay goes before any later frame
            for p in self.chain.since(have):
                peer.push(to_views(p), None)
            if not peer.joined:
                peer.joined = True
                self.peers.append(peer)

    def _drop(self, peer: _Peer) -> None:
        with self.lock:
            if peer in self.peers:
                self.peers.remove(peer)
        peer.kill()

    @property
    def n_receivers(self) -> int:
        with self.lock:
            return len(self.peers)

    def send(self, payload: Payload) -> None:
        views = to_views(payload)
        with self.lock:
            self.chain.add(payload)
            waits = [(peer, threading.Event()) for peer in self.peers]
            for peer, done in waits:
                peer.push(views, done)
        deadline = time.monotonic() + self.cfg.send_timeout_s
        for peer, done in waits:
            if not done.wait(max(0.0, deadline - time.monotonic())):
                self._drop(peer)  # too slow or dead: the others go on

    def close(self) -> None:
        self._closed = True
        with self.lock:
            peers = list(self.peers)
        for peer in peers:
            done = threading.Event()
            peer.push([], done)
            done.wait(1.0)
            self._drop(peer)
        _shutdown(self.server)  # wakes the accept thread, so the port is free at once


class TcpReceiver:
    def __init__(self, cfg: TcpConfig = TcpConfig(), have_hash: str | None = None) -> None:
        self.cfg = cfg
        deadline = time.monotonic() + cfg.connect_timeout_s
        while True:
            try:
                self.sock = socket.create_connection((cfg.host, cfg.port), timeout=1.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(cfg.dead_after_s)
        self.cond = threading.Condition()
        self.frames: deque[bytearray] = deque()
        self.error: Exception | None = None
        self.last_heard = time.monotonic()
        self._closed = False
        self._control(HELLO, have_hash)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _control(self, kind: int, have: str | None) -> None:
        body = memoryview(json.dumps({"have": have}).encode())
        _send_msg(self.sock, kind, [body], self.cfg.chunk_bytes)

    def _heard(self) -> None:
        self.last_heard = time.monotonic()

    def _read(self) -> None:
        hdr = bytearray(_HDR.size)
        try:
            while True:
                _recv_into(self.sock, hdr, self._heard)
                magic, kind, n = _HDR.unpack(hdr)
                if magic != _MAGIC or n > self.cfg.max_frame_bytes:
                    raise PeerDead("garbled stream from sender")
                if kind == BYE:
                    raise PeerDead("sender closed")
                if kind == HEARTBEAT:
                    continue
                buf = bytearray(n)
                _recv_into(self.sock, buf, self._heard)
                with self.cond:
                    while len(self.frames) >= self.cfg.max_pending and not self._closed:
                        self.cond.wait(0.1)
                    self.frames.append(buf)
                    self.cond.notify()
        except TimeoutError as err:
            self._fail(PeerDead(f"sender silent for {self.cfg.dead_after_s}s"), err)
        except (OSError, PeerDead) as err:
            self._fail(err if isinstance(err, PeerDead) else PeerDead(str(err)), err)

    def _fail(self, err: Exception, cause: Exception) -> None:
        err.__cause__ = cause
        with self.cond:
            self.error = err
            self.cond.notify_all()

    def receive(self, timeout: float) -> Payload:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.frames:
                if self.error is not None:
                    raise self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportTimeout(f"no update within {timeout}s")
                self.cond.wait(min(left, self.cfg.heartbeat_s))
            buf = self.frames.popleft()
            self.cond.notify_all()
        return from_buffer(buf)

    def resync(self, have_hash: str | None) -> None:
        with self.cond:
            self.frames.clear()
        self._control(RESYNC, have_hash)

    def close(self) -> None:
        self._closed = True
        _shutdown(self.sock)
        self._thread.join(timeout=self.cfg.dead_after_s)


TRANSPORT = Transport(
    "tcp",
    lambda w, ctx: TcpConfig(host=ctx.host, port=0, send_timeout_s=w.timeout_s,
                             dead_after_s=w.dead_after_s),
    TcpSender, TcpReceiver,
    Abilities(crosses_processes=True, crosses_nodes=True, reconnects=True),
    connect=lambda cfg, sender: dataclasses.replace(cfg, port=sender.port))
