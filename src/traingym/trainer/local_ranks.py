"""Worker ranks of the data-parallel trainer as local processes (multiprocessing spawn).

Each worker process builds its replica, answers ("ok", pid) on its pipe, then serves rank 0's
commands (trainer/rank.py: RankServer) until `close`, an error (answered, then the process
exits), or the end of the pipe (the driver is gone). Commands and answers are small Python
values (token-id lists, floats); weights go over the gloo group, never through the pipe.
Rendezvous on 127.0.0.1. Spawn imports the driver's `__main__`: scripts need an
`if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from traingym.trainer.rank import RankServer, RankSpec, describe


def rank_main(spec: RankSpec, rank: int, conn) -> None:
    try:
        server = RankServer(spec, rank)
    except Exception as e:
        conn.send(("error", describe(e)))
        return
    conn.send(("ok", {"pid": os.getpid(), "node": None}))
    while True:
        try:
            cmd, arg = conn.recv()
        except EOFError:  # the driver is gone
            server.rank.abort()
            return
        kind, value = server.handle(cmd, arg)
        conn.send((kind, value))
        if kind == "error" or cmd == "close":
            return


class ProcessRank:
    """Rank 0's handle on one worker process. `reply` answers (kind, value): kind "ok" or
    "error" as the worker sent it, "dead" (the process ended) or "silent" (no answer in
    time), value then a description."""

    def __init__(self, ctx, spec: RankSpec, rank: int):
        self.rank = rank
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=rank_main, args=(spec, rank, child), daemon=True,
                                name=f"traingym-trainer-rank{rank}")
        self.proc.start()
        child.close()  # so the pipe ends when the worker does
        self.pid, self.node = self.proc.pid, None

    def send(self, cmd: str, arg) -> None:
        try:
            self.conn.send((cmd, arg))
        except OSError:  # the worker is gone; reply() says how
            pass

    def reply(self, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.conn.poll(max(0.0, min(0.1, deadline - time.monotonic()))):
                    return self.conn.recv()
            except (EOFError, OSError):
                return "dead", self._exit()
            if not self.proc.is_alive() and not self.conn.poll(0):
                return "dead", self._exit()
            if time.monotonic() >= deadline:
                return "silent", f"no answer within {timeout:.0f}s (process alive)"

    def _exit(self) -> str:
        self.proc.join(2.0)
        code = self.proc.exitcode
        if code is None:
            return "closed its pipe"
        if code < 0:
            return f"died (killed by {signal.Signals(-code).name})"
        return f"exited with code {code}"

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5.0)
        self.conn.close()

    def wait_exit(self, timeout: float) -> None:
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.kill()
        self.conn.close()


class LocalPlacement:
    """Worker ranks as processes on this machine."""

    host = "127.0.0.1"
    driver_node = None

    def start(self, spec: RankSpec) -> list[ProcessRank]:
        ctx = mp.get_context("spawn")
        return [ProcessRank(ctx, spec, r) for r in range(1, spec.world)]

    def release(self) -> None:
        return None
