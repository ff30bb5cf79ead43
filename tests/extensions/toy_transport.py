"""A toy weight transport: each frame (weights/frame.py) is one numbered file in the run's
scratch directory, written under a temporary name and renamed; a receiver reads them in order,
starting at the newest anchor. Sends and receipts are logged to the file named by
$TOY_TRANSPORT_LOG when set: "send <dir> <seq> <codec> <bytes>" and "recv <dir> <pid> <seq>",
<dir> the scratch directory's name. Works across processes of one machine. Test-only: proof
that a transport is one file (its `TRANSPORT` record) plus one registry line
(weights/registry.py TRANSPORTS) or a "module:ATTR" path in weights.transport.
Not covered: liveness (a sender that dies unclosed leaves receivers waiting for their timeout).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from traingym.weights.base import PeerDead, TransportTimeout
from traingym.weights.frame import from_buffer, to_views
from traingym.weights.registry import Abilities, Transport


@dataclass(frozen=True)
class ToyConfig:
    root: str
    log: str = ""


def _log(cfg: ToyConfig, line: str) -> None:
    if cfg.log:
        with open(cfg.log, "a") as f:
            f.write(line + "\n")


class ToySender:
    def __init__(self, cfg: ToyConfig) -> None:
        self.cfg, self.root, self.seq = cfg, Path(cfg.root), 0
        self.root.mkdir(parents=True, exist_ok=True)

    def send(self, payload) -> None:
        path = self.root / f"{self.seq:08d}-{payload.header.codec}.frame"
        with open(path.with_suffix(".tmp"), "wb") as f:
            f.writelines(to_views(payload))
        os.replace(path.with_suffix(".tmp"), path)
        _log(self.cfg, f"send {self.root.name} {self.seq} {payload.header.codec} "
                       f"{payload.nbytes}")
        self.seq += 1

    def close(self) -> None:
        (self.root / "CLOSED").touch()


class ToyReceiver:
    def __init__(self, cfg: ToyConfig) -> None:
        self.cfg, self.root = cfg, Path(cfg.root)
        self.resync(None)

    def receive(self, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            found = list(self.root.glob(f"{self.next:08d}-*.frame"))
            if found:
                _log(self.cfg, f"recv {self.root.name} {os.getpid()} {self.next}")
                self.next += 1
                return from_buffer(bytearray(found[0].read_bytes()))
            if (self.root / "CLOSED").exists():
                raise PeerDead(f"toy sender closed {self.root}")
            if time.monotonic() >= deadline:
                raise TransportTimeout(f"no frame {self.next} in {self.root} within {timeout}s")
            time.sleep(0.005)

    def resync(self, have_hash) -> None:
        anchors = sorted(self.root.glob("*-full.frame"))
        self.next = int(anchors[-1].name.split("-")[0]) if anchors else 0

    def close(self) -> None:
        pass


def _config(weights, ctx) -> ToyConfig:
    return ToyConfig(str(ctx.scratch_dir), os.environ.get("TOY_TRANSPORT_LOG", ""))


TRANSPORT = Transport("toy", _config, ToySender, ToyReceiver,
                      Abilities(crosses_processes=True, crosses_nodes=False))
