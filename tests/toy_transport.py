"""A toy weight transport: proof that a new transport is this one file plus one registry entry
(tests/weights/test_toy_transport.py runs training over it in sync and async mode).

The sender writes each frame (weights/frame.py) to `<root>/<seq>-<codec>.tgw`, under a
temporary name first and then renamed, so a reader never sees half a frame; closing writes
`CLOSED`. A receiver reads the files in sequence order, starting at the newest anchor;
`resync` goes back to the newest anchor. Works across processes of one machine.
Sends and receipts are logged to the file named by $TOY_TRANSPORT_LOG when set (tests/extensions):
"send <dir> <seq> <codec> <bytes>" and "recv <dir> <pid> <seq>", <dir> the root's name.
Not covered: liveness (a sender that dies without closing leaves receivers waiting until
their timeout), deleting old frames (every frame stays until the run removes the directory).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from traingym.weights.base import Payload, PeerDead, TransportTimeout
from traingym.weights.frame import from_buffer, to_views
from traingym.weights.registry import Abilities, Transport


@dataclass(frozen=True)
class ToyConfig:
    root: str
    type: str = "toy"
    poll_s: float = 0.005
    log: str = ""


def _log(cfg: ToyConfig, line: str) -> None:
    if cfg.log:
        with open(cfg.log, "a") as f:
            f.write(line + "\n")


class ToySender:
    def __init__(self, cfg: ToyConfig) -> None:
        self.cfg, self.root, self.seq = cfg, Path(cfg.root), 0
        self.root.mkdir(parents=True, exist_ok=True)

    def send(self, payload: Payload) -> None:
        path = self.root / f"{self.seq:08d}-{payload.header.codec}.tgw"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for view in to_views(payload):
                f.write(view)
        os.replace(tmp, path)
        _log(self.cfg, f"send {self.root.name} {self.seq} {payload.header.codec} "
                       f"{payload.nbytes}")
        self.seq += 1

    def close(self) -> None:
        (self.root / "CLOSED").touch()


class ToyReceiver:
    def __init__(self, cfg: ToyConfig) -> None:
        self.cfg, self.root = cfg, Path(cfg.root)
        self.resync(None)

    def receive(self, timeout: float) -> Payload:
        deadline = time.monotonic() + timeout
        while True:
            found = list(self.root.glob(f"{self.next:08d}-*.tgw"))
            if found:
                _log(self.cfg, f"recv {self.root.name} {os.getpid()} {self.next}")
                self.next += 1
                return from_buffer(bytearray(found[0].read_bytes()))
            if (self.root / "CLOSED").exists():
                raise PeerDead(f"toy sender closed {self.root}")
            if time.monotonic() >= deadline:
                raise TransportTimeout(f"no frame {self.next} in {self.root} within {timeout}s")
            time.sleep(self.cfg.poll_s)

    def resync(self, have_hash: str | None) -> None:
        anchors = sorted(self.root.glob("*-full.tgw"))
        self.next = int(anchors[-1].name.split("-")[0]) if anchors else 0

    def close(self) -> None:
        pass


TRANSPORT = Transport("toy", lambda weights, ctx: ToyConfig(
                          root=str(ctx.scratch_dir), log=os.environ.get("TOY_TRANSPORT_LOG", "")),
                      ToySender, ToyReceiver,
                      Abilities(crosses_processes=True, crosses_nodes=False))
