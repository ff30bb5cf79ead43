"""Rollout engines as local processes (multiprocessing spawn), and the trainer's side of their
weight sync.

`LocalEngines` starts `async.engines` engine processes (cluster/engine_process.py), publishes
the trainer's weights to all of them through one Publisher (an anchor first, then deltas or
anchors after each step), hands each job to the engine holding the fewest and returns scored
groups in arrival order. A result is accepted only from the engine incarnation that holds its
job, so no job is trained on twice. A dead engine is restarted with its jobs (up to
`async.restarts`, then EngineDied); an engine that raises (EngineError) or holds jobs silently
for `async.engine_timeout_s` (EngineStalled) fails the run; `verify_final` checks every
engine's weights hash for hash. cluster/ray.py overrides `_spawn` and `tcp_host`.
Not covered: engines on other machines (cluster/ray.py places them).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from traingym.cluster.config import AsyncConfig, ClusterConfig
from traingym.cluster.engine_process import EngineSpec, Job, engine_main, tokenizer_fingerprint
from traingym.core import trace
from traingym.core.errors import ConfigError
from traingym.core.precision import engine_dtype
from traingym.core.registry import one_of, snapshot
from traingym.envs.config import TaskConfig
from traingym.rollout import registry as engines
from traingym.rollout.config import RolloutConfig
from traingym.rollout.context import EngineContext
from traingym.weights import registry
from traingym.weights.colocated import wire_views
from traingym.weights.config import WeightsConfig
from traingym.weights.sync import Publisher, PublisherConfig


class EngineError(RuntimeError):
    """Code inside an engine process raised (an env, a reward, the engine); carries its
    traceback."""


class EngineDied(RuntimeError):
    """An engine process exited unasked and no restart was left."""


class EngineStalled(TimeoutError):
    """An engine held work and delivered nothing within async.engine_timeout_s."""


@dataclass
class _Handle:
    eid: int
    incarnation: int
    proc: mp.Process
    requests: mp.Queue
    results: mp.Queue
    pump: threading.Thread | None = None
    jobs: dict = field(default_factory=dict)  # key -> Job, dispatched and not yet delivered
    ready: dict | None = None
    last_heard: float = field(default_factory=time.monotonic)
    stopping: bool = False


def _transport(weights_cfg, run_dir: Path, host: str = "127.0.0.1"):
    """The transport config for engines in other processes, and the sender over it (scratch:
    `<run dir>/weights-engines`, emptied first)."""
    t = weights_cfg.transport
    if not registry.get(t).abilities.crosses_processes:
        raise ValueError(f"weights.transport={t!r} does not reach other processes; choose "
                         f"{one_of(registry.able('crosses_processes'))}")
    scratch = run_dir / "weights-engines"
    if scratch.exists():
        shutil.rmtree(scratch)
    ctx = registry.SyncContext(scratch, f"engines-{os.getpid()}-{uuid.uuid4().hex[:8]}", host)
    return registry.open_sender(t, weights_cfg, ctx)


@dataclass
class EnginesSetup:
    """What the trainer's side hands its engines (built by loop/async_loop.py from the run)."""

    ctx: EngineContext  # how each engine is built
    rollout: RolloutConfig
    task: TaskConfig
    weights: WeightsConfig
    async_: AsyncConfig
    cluster: ClusterConfig
    run_dir: Path
    state: dict  # the trainer's weights now (trainer.export()): the first anchor
    tokenizer: Any  # the trainer's, to check the engines' against
    reward_fn: Callable | None = None
    env: Callable | None = None
    group_reward: Callable | None = None


class LocalEngines:
    tcp_host = "127.0.0.1"  # where the trainer's weight sender listens (cluster/ray.py: the
    # node's address)
    trace_node = None  # the node the run directory is on (cluster/ray.py: the driver's)

    def __init__(self, setup: EnginesSetup, start_version: int):
        self.acfg, self.run_dir = setup.async_, setup.run_dir
        self.dtype = engine_dtype(setup.ctx.dtype)
        entry = registry.get(setup.weights.transport)
        self.transport, self.sender = _transport(setup.weights, setup.run_dir, self.tcp_host)
        self.owned = [setup.run_dir / "weights-engines", entry.owned(self.sender)]
        w = setup.weights
        self.publisher = Publisher(self.sender, PublisherConfig(w.codec, w.anchor_budget,
                                                                threads=w.threads))
        self.publish(setup.state, start_version)  # an anchor before any engine joins
        self.spec = EngineSpec(setup.ctx, setup.rollout, setup.task, setup.weights,
                               setup.async_.inflight_updates, self.transport, entry.receiver,
                               entry.abilities.reconnects, start_version,
                               engines.get(setup.ctx.engine), setup.reward_fn, setup.env,
                               setup.group_reward, trace=trace.enabled(),
                               trace_dir=trace.shard_dir(), trace_node=self.trace_node,
                               registries=snapshot())
        self.tokenizer = tokenizer_fingerprint(setup.tokenizer)
        self.ctx = mp.get_context("spawn")
        self.inbox: queue.Queue = queue.Queue()
        self.restarts_left = self.acfg.restarts
        self.stats = {"engine_restarts": 0, "redispatched": 0, "ignored_results": 0}
        try:
            pickle.dumps(self.spec)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            self.sender.close()
            raise ConfigError("mode='async' sends the reward, env and group hook to engine "
                              "processes: each must be picklable (a module-level function or "
                              f"class, or a dataclass of such): {e}") from e
        self.handles: list[_Handle] = []
        try:
            for eid in range(self.acfg.engines):
                self.handles.append(self._start(eid, 0))
        except BaseException:  # stop what started, release the transport, re-raise
            self.close()
            raise

    # ---- processes ----------------------------------------------------------------------
    def _spawn(self, eid: int, spec: EngineSpec):
        """Start one engine; return (proc, requests, results) with multiprocessing's Process
        and Queue interfaces. The seam cluster/ray.py overrides (actors instead)."""
        requests, results = self.ctx.Queue(), self.ctx.Queue()
        proc = self.ctx.Process(target=engine_main, args=(spec, requests, results),
                                name=f"traingym-engine-{eid}", daemon=True)
        proc.start()
        return proc, requests, results

    def _start(self, eid: int, incarnation: int) -> _Handle:
        spec = dataclasses.replace(self.spec, start_version=self.publisher.version,
                                   role=f"engine-{eid}")
        proc, requests, results = self._spawn(eid, spec)
        h = _Handle(eid, incarnation, proc, requests, results)
        h.pump = threading.Thread(target=self._pump, args=(h,), daemon=True)
        h.pump.start()
        return h

    def _pump(self, h: _Handle) -> None:
        """Move one engine's messages into the shared inbox until its process has ended."""
        while True:
            try:
                msg = h.results.get(timeout=0.1)
            except queue.Empty:
                if h.proc.exitcode is not None:
                    return
                continue
            except (EOFError, OSError):
                return
            self.inbox.put((h.eid, h.incarnation, msg))

    def _on_exit(self, h: _Handle) -> None:
        """An engine process ended unasked: surface its error, or restart it, or fail."""
        h.pump.join(timeout=2.0)  # its last messages (an error report) reach the inbox
        held = []
        while True:
            try:
                held.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        for eid, inc, msg in held:
            if (eid, inc) == (h.eid, h.incarnation) and msg[0] == "error":
                raise EngineError(f"rollout engine {h.eid} (pid {h.proc.pid}) raised:\n{msg[1]}")
        for item in held:
            self.inbox.put(item)
        what = (f"rollout engine {h.eid} (pid {h.proc.pid}) exited with code "
                f"{h.proc.exitcode} holding {len(h.jobs)} prompts")
        if h.ready is None:
            what += (" before it was ready (see its stderr above; a script that starts an "
                     "async run needs an `if __name__ == '__main__':` guard, as spawn re-imports"
                     " it)")
        if self.restarts_left <= 0:
            raise EngineDied(f"{what}; async.restarts={self.acfg.restarts} allows no further "
                             "restart")
        self.restarts_left -= 1
        self.stats["engine_restarts"] += 1
        new = self._start(h.eid, h.incarnation + 1)
        self.handles[h.eid] = new
        for job in h.jobs.values():
            self._send(new, job)
        self.stats["redispatched"] += len(h.jobs)

    # ---- jobs ---------------------------------------------------------------------------
    def _send(self, h: _Handle, job: Job) -> None:
        if not h.jobs:
            h.last_heard = time.monotonic()  # the stall clock starts with the first job
        h.jobs[job.key] = job
        h.requests.put(job)

    def dispatch(self, job: Job) -> None:
        job = dataclasses.replace(job, version=self.publisher.version)
        self._send(min(self.handles, key=lambda h: len(h.jobs)), job)

    def held(self) -> list[tuple[int, int]]:
        return [k for h in self.handles for k in h.jobs]

    def next(self):
        """The next scored group from any engine: (key, group, engine meta)."""
        while True:
            try:
                eid, inc, msg = self.inbox.get(timeout=0.05)
            except queue.Empty:
                self._check()
                continue
            h = self.handles[eid]
            if inc != h.incarnation:
                self.stats["ignored_results"] += 1  # from a dead predecessor: redone
                continue
            h.last_heard = time.monotonic()
            if msg[0] == "error":
                raise EngineError(f"rollout engine {eid} (pid {h.proc.pid}) raised:\n{msg[1]}")
            if msg[0] == "ready":
                if msg[1]["tokenizer"] != self.tokenizer:
                    raise EngineError(f"rollout engine {eid} built a tokenizer that differs "
                                      "from the trainer's; token ids would not mean the same")
                h.ready = msg[1]
                continue
            key, group, meta = msg[1], msg[2], msg[3]
            trace.write_shipped(*meta.pop("trace", ([], "", 0)))  # a Ray actor's, elsewhere
            if h.jobs.pop(key, None) is None:
                self.stats["ignored_results"] += 1
                continue
            return key, group, meta

    def _check(self) -> None:
        now = time.monotonic()
        for h in list(self.handles):
            if h.proc.exitcode is not None:
                self._on_exit(h)
            elif h.jobs and now - h.last_heard > self.acfg.engine_timeout_s:
                raise EngineStalled(f"rollout engine {h.eid} (pid {h.proc.pid}) holds "
                                    f"{len(h.jobs)} prompts and delivered nothing for "
                                    f"{self.acfg.engine_timeout_s}s (async.engine_timeout_s)")

    def verify_final(self) -> list[dict]:
        """Every engine's model holds exactly the last published weights (hash-equal), or
        EngineError. Results still arriving for unfinished jobs are left undelivered."""
        want = self.publisher.version
        for h in self.handles:
            h.requests.put(("report", want))
        reports: dict[int, dict] = {}
        deadline = time.monotonic() + self.acfg.engine_timeout_s
        while len(reports) < len(self.handles):
            if time.monotonic() > deadline:
                missing = sorted(set(range(len(self.handles))) - set(reports))
                raise EngineStalled(f"engines {missing} did not report their weights within "
                                    f"{self.acfg.engine_timeout_s}s")
            try:
                eid, inc, msg = self.inbox.get(timeout=0.05)
            except queue.Empty:
                self._check()
                continue
            h = self.handles[eid]
            if inc != h.incarnation or msg[0] in ("group", "ready"):
                continue
            if msg[0] == "error":
                raise EngineError(f"rollout engine {eid} (pid {h.proc.pid}) raised:\n{msg[1]}")
            reports[eid] = msg[1]
        published = self.publisher.full_hash()  # xxh3 of the state (a delta's `hash` is not)
        for eid, r in sorted(reports.items()):
            if (r["version"], r["hash"]) != (want, published):
                raise EngineError(f"rollout engine {eid} holds version {r['version']} with hash "
                                  f"{r['hash']}, not the published {want} ({published})")
        return [{"engine": eid, **r} for eid, r in sorted(reports.items())]

    # ---- weights ------------------------------------------------------------------------
    def publish(self, state, version: int) -> dict:
        """Send `version` to every engine (they apply it between engine calls)."""
        t0 = time.perf_counter()
        wire = wire_views(state)  # the publisher casts, finding a delta's changes as it goes
        stats = self.publisher.publish(wire, version, cast=self.dtype)
        numel = sum(t.numel() for t in wire.values())
        return {"sync_version": version, "sync_codec": stats.codec, "sync_reason": stats.reason,
                "sync_bytes": stats.payload_bytes, "sync_full_bytes": stats.full_bytes,
                "sync_changed_frac": stats.changed / numel if stats.changed >= 0 else None,
                "sync_encode_s": stats.encode_s, "sync_send_s": stats.send_s,
                "sync_publish_s": time.perf_counter() - t0}

    def close(self) -> None:
        for h in self.handles:
            if h.proc.exitcode is None:
                h.requests.put(None)
        for h in self.handles:
            h.proc.join(timeout=10.0)
            if h.proc.exitcode is None:
                h.proc.kill()
                h.proc.join(timeout=5.0)
            h.requests.cancel_join_thread()
            h.pump.join(timeout=1.0)  # it returns once the process has ended
        self.sender.close()
        for path in self.owned:
            if path is not None and path.exists():
                shutil.rmtree(path)
