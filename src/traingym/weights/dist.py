"""torch.distributed transport: broadcast from the trainer rank, bucketed.

All ranks of the group take part in one round per publish, in lockstep:
    all_reduce(MAX) of "I need a resync" flags -> broadcast the frame count and sizes ->
    broadcast each frame in buckets of `bucket_bytes` (moved to `device`: "cuda" for NCCL).
When any rank asked for a resync, the round carries the whole chain from the last anchor; ranks that
did not need it skip the versions they hold. The caller initialises the process group with the
timeout it wants: a dead peer fails the collective after it, raised as PeerDead.
Covered: gloo on CPU (tested over processes). Not covered: NCCL is untested; `receive(timeout)`
cannot stop earlier than the group's own timeout.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist

from traingym.weights.base import Payload, PeerDead
from traingym.weights.frame import from_buffer, to_views
from traingym.weights.registry import Abilities, Transport
from traingym.weights.chain import Chain


@dataclass(frozen=True)
class DistConfig:
    type: str = "dist"
    src: int = 0
    bucket_bytes: int = 64 << 20
    device: str = "cpu"


class _Round:
    def __init__(self, cfg: DistConfig) -> None:
        self.cfg = cfg

    def flags(self, need: int) -> int:
        t = torch.tensor([need], dtype=torch.int64, device=self.cfg.device)
        self._call(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def sizes(self, sizes: list[int] | None) -> list[int]:
        n = torch.tensor([len(sizes) if sizes is not None else 0], dtype=torch.int64,
                         device=self.cfg.device)
        self._call(dist.broadcast, n, src=self.cfg.src)
        t = (torch.tensor(sizes, dtype=torch.int64) if sizes is not None
             else torch.zeros(int(n.item()), dtype=torch.int64)).to(self.cfg.device)
        self._call(dist.broadcast, t, src=self.cfg.src)
        return t.tolist()

    def frame(self, buf: bytearray) -> None:
        host = torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0)
        step = self.cfg.bucket_bytes
        for off in range(0, len(buf), step):
            part = host[off : off + step]
            bucket = part.to(self.cfg.device) if self.cfg.device != "cpu" else part
            self._call(dist.broadcast, bucket, src=self.cfg.src)
            if bucket is not part:
                part.copy_(bucket.cpu())

    @staticmethod
    def _call(fn, *args, **kw) -> None:
        try:
            fn(*args, **kw)
        except RuntimeError as err:  # gloo / NCCL report dead peers and timeouts this way
            raise PeerDead(f"torch.distributed {fn.__name__} failed: {err}") from err


class DistSender:
    def __init__(self, cfg: DistConfig = DistConfig()) -> None:
        self.cfg, self.chain, self.round = cfg, Chain(), _Round(cfg)

    def send(self, payload: Payload) -> None:
        self.chain.add(payload)
        need = self.round.flags(0)
        frames = self.chain.since(None) if need else [payload]
        bufs = [bytearray(b"".join(to_views(p))) for p in frames]
        self.round.sizes([len(b) for b in bufs])
        for b in bufs:
            self.round.frame(b)

    def close(self) -> None:
        pass


class DistReceiver:
    def __init__(self, cfg: DistConfig = DistConfig()) -> None:
        self.cfg, self.round = cfg, _Round(cfg)
        self._need = 1  # a new receiver has nothing: the first round brings the chain
        self._queue: deque[bytearray] = deque()

    def receive(self, timeout: float) -> Payload:
        while not self._queue:
            self.round.flags(self._need)
            self._need = 0
            for size in self.round.sizes(None):  # take the whole round, then parse
                buf = bytearray(size)
                self.round.frame(buf)
                self._queue.append(buf)
        return from_buffer(self._queue.popleft())

    def resync(self, have_hash: str | None) -> None:
        self._queue.clear()
        self._need = 1

    def close(self) -> None:
        pass


TRANSPORT = Transport(
    "dist", lambda w, ctx: DistConfig(), DistSender, DistReceiver,
    Abilities(crosses_processes=True, crosses_nodes=True, needs_process_group=True),
    not_in_loop=(
        "the loop sets up no process group between the trainer and the engines, and this "
        "transport does not fit async engines yet: receive() blocks in a collective until the "
        "next publish (an engine could not generate meanwhile), a gloo/NCCL group has a fixed "
        "world (a restarted engine cannot rejoin), and trainer.data_parallel ranks already use "
        "the default group; use it standalone (tests/weight_sync_builders.py, tests/weights/test_dist.py)"))
