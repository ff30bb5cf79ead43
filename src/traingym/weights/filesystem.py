"""Directory transport (a filesystem, or an object store mounted as one), and shared memory.

Under `root`: one frame per file (`000000000012-full.tgw`, `...-delta.tgw`), `HEAD` (JSON: the chain
from the last anchor, the sender's pid and host, whether it closed) and `HEARTBEAT` (rewritten every
`heartbeat_s`). A frame is written to a temporary name, fsynced and renamed before HEAD (also
renamed) lists it, so a sender that dies mid-publish leaves nothing a reader opens. Receivers resume
from the hash they last delivered, or from the anchor when it is gone; chains older than the
previous one are deleted at each anchor.
`shm` is the same protocol under /dev/shm, with no fsync, zero-copy mmap reads and a pid liveness
check.
Not covered: object stores without atomic rename (S3 needs a conditional-put marker).
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from traingym.weights.base import Payload, PeerDead, TransportTimeout
from traingym.weights.frame import from_buffer, to_views
from traingym.weights.registry import Abilities, Transport


@dataclass(frozen=True)
class FilesystemConfig:
    type: str = "filesystem"
    root: str = "weights"
    poll_s: float = 0.01
    heartbeat_s: float = 1.0
    dead_after_s: float = 10.0
    fsync: bool = True


@dataclass(frozen=True)
class ShmConfig:
    type: str = "shm"
    name: str = "default"
    poll_s: float = 0.002
    heartbeat_s: float = 1.0
    dead_after_s: float = 10.0


def _shm_fs(cfg: ShmConfig) -> FilesystemConfig:
    return FilesystemConfig(root=f"/dev/shm/traingym-{cfg.name}", poll_s=cfg.poll_s,
                            heartbeat_s=cfg.heartbeat_s, dead_after_s=cfg.dead_after_s,
                            fsync=False)


def _write_atomic(path: Path, views, fsync: bool) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "wb") as f:
        for v in views:
            f.write(v)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


class FilesystemSender:
    def __init__(self, cfg: FilesystemConfig = FilesystemConfig()) -> None:
        self.cfg, self.root = cfg, Path(cfg.root)
        self.root.mkdir(parents=True, exist_ok=True)
        for tmp in self.root.glob(".tmp-*"):  # left by a sender that died mid-publish
            tmp.unlink()
        self._chain: list[dict] = []
        self._previous: list[dict] = []
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        _write_atomic(self.root / "HEARTBEAT", [str(time.time()).encode()], False)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.cfg.heartbeat_s):
            self._beat()

    def _head(self, closed: bool) -> None:
        head = {"chain": self._chain, "pid": os.getpid(), "host": socket.gethostname(),
                "closed": closed}
        _write_atomic(self.root / "HEAD", [json.dumps(head).encode()], self.cfg.fsync)

    def send(self, payload: Payload) -> None:
        h = payload.header
        name = f"{h.target_version:012d}-{h.codec}.tgw"
        _write_atomic(self.root / name, to_views(payload), self.cfg.fsync)
        entry = {"file": name, "version": h.target_version, "hash": h.target_hash}
        if payload.is_anchor:
            old = {e["file"] for e in self._previous}
            self._previous, self._chain = self._chain, [entry]
        else:
            self._chain = [*self._chain, entry]
            old = set()
        self._head(closed=False)
        keep = {e["file"] for e in self._chain + self._previous}
        for f in old - keep:
            (self.root / f).unlink(missing_ok=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._head(closed=True)


class FilesystemReceiver:
    def __init__(self, cfg: FilesystemConfig = FilesystemConfig(), use_mmap: bool = False,
                 check_pid: bool = False) -> None:
        self.cfg, self.root = cfg, Path(cfg.root)
        self.use_mmap, self.check_pid = use_mmap, check_pid
        self._last_hash: str | None = None  # hash of the last delivered frame
        self._last_version = -1

    def _read_head(self) -> dict | None:
        try:
            return json.loads((self.root / "HEAD").read_bytes())
        except FileNotFoundError:
            return None

    def _check_alive(self, head: dict | None) -> None:
        if head is not None and head["closed"]:
            raise PeerDead(f"sender closed {self.root}")
        if head is not None and self.check_pid and head["host"] == socket.gethostname():
            try:
                os.kill(head["pid"], 0)
            except ProcessLookupError as err:
                raise PeerDead(f"sender pid {head['pid']} is gone") from err
        try:
            age = time.time() - float((self.root / "HEARTBEAT").read_bytes())
        except FileNotFoundError:
            return
        if age > self.cfg.dead_after_s:
            raise PeerDead(f"sender heartbeat in {self.root} is {age:.1f}s old")

    def _next_entry(self, head: dict) -> dict | None:
        chain = head["chain"]
        # after the entry delivered last (its version and hash: a step that changes nothing
        # keeps the hash), else after the first with the hash held (a resync), else the anchor
        at = [i for i, e in enumerate(chain) if e["hash"] == self._last_hash]
        exact = [i for i in at if chain[i]["version"] == self._last_version]
        if exact or at:
            i = (exact or at)[0]
            return chain[i + 1] if i + 1 < len(chain) else None
        newer = [e for e in chain if e["version"] > self._last_version]
        return chain[0] if newer else None

    def _read(self, name: str):
        with open(self.root / name, "rb") as f:
            if self.use_mmap:
                return mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            buf = bytearray(os.fstat(f.fileno()).st_size)
            f.readinto(buf)
            return buf

    def receive(self, timeout: float) -> Payload:
        deadline = time.monotonic() + timeout
        while True:
            head = self._read_head()
            entry = self._next_entry(head) if head else None
            if entry is not None:
                try:
                    buf = self._read(entry["file"])
                except FileNotFoundError:  # collected by a newer anchor: take that chain
                    self._last_hash = None
                    continue
                self._last_hash, self._last_version = entry["hash"], entry["version"]
                return from_buffer(buf)
            self._check_alive(head)
            if time.monotonic() >= deadline:
                raise TransportTimeout(f"no update in {self.root} within {timeout}s")
            time.sleep(self.cfg.poll_s)

    def resync(self, have_hash: str | None) -> None:
        self._last_hash, self._last_version = have_hash, -1

    def close(self) -> None:
        pass


class ShmSender(FilesystemSender):
    def __init__(self, cfg: ShmConfig = ShmConfig()) -> None:
        super().__init__(_shm_fs(cfg))

    def unlink(self) -> None:
        """Remove the segment directory (shared memory outlives processes otherwise)."""
        for f in self.root.iterdir():
            f.unlink()
        self.root.rmdir()


class ShmReceiver(FilesystemReceiver):
    def __init__(self, cfg: ShmConfig = ShmConfig()) -> None:
        super().__init__(_shm_fs(cfg), use_mmap=True, check_pid=True)


TRANSPORT = Transport(
    "filesystem",
    lambda w, ctx: FilesystemConfig(root=str(ctx.scratch_dir), dead_after_s=w.dead_after_s),
    FilesystemSender, FilesystemReceiver,
    Abilities(crosses_processes=True, crosses_nodes=False))  # a shared filesystem would cross
# nodes, but the run's scratch dir is not known to be shared

SHM = Transport("shm", lambda w, ctx: ShmConfig(name=ctx.tag, dead_after_s=w.dead_after_s),
                ShmSender, ShmReceiver, Abilities(crosses_processes=True, crosses_nodes=False),
                owned=lambda sender: sender.root)
