"""A rollout engine in its own process: build the model from the EngineContext, take weights
only through the weight-sync Subscriber (hash-verified), and turn prompts into scored groups.

Started under spawn by cluster/local.py (or in a Ray actor, cluster/ray.py). It reports its
tokenizer's fingerprint, serves nothing until it holds a verified version >= the one it was
started for, and starts each job (one prompt) only on weights at least as new as those published
when the job was sent, so a fresh prompt is never sampled from replaced weights. Each job is an
asyncio task; the generation requests of all live tasks go into one engine call. Between calls
it applies every verified update, so a turn started under version v is sampled under v and each
token records its version (`async.inflight_updates`: between decode steps too). It exits when
told, when the trainer's process is gone, or with ("error", traceback) on any exception, closing
its run resources (envs/resources.py) first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import queue
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import xxhash

from traingym.core import trace
from traingym.core.registry import restore
from traingym.core.types import SamplingParams
from traingym.envs.config import TaskConfig
from traingym.envs.factory import episode_factory
from traingym.envs.resources import RunResources
from traingym.envs.runner import CLOSE_TIMEOUT_S, EpisodeLimits, RolloutRunner
from traingym.models.families import stop_token_ids
from traingym.models.loader import load_policy
from traingym.rollout.base import UNSERVED
from traingym.rollout.config import RolloutConfig
from traingym.rollout.context import EngineContext
from traingym.rollout.registry import build
from traingym.weights.base import TransportTimeout
from traingym.weights.config import WeightsConfig


@dataclass(frozen=True)
class Job:
    key: tuple[int, int]  # (prompt index in the training stream, attempt)
    row: dict[str, Any]
    seed: int
    version: int = -1  # the newest weights published when it was sent: started on those or newer


@dataclass
class EngineSpec:
    """Everything an engine process needs; picklable (callables must be module-level)."""

    ctx: EngineContext  # how the engine is built (config/engines.py engine_context)
    rollout: RolloutConfig  # sampling, group size, episode limits
    task: TaskConfig  # the prompt's prefill and system prompt
    weights: WeightsConfig  # the receiving side's threads and timeout
    inflight_updates: bool  # async.inflight_updates: new weights between decode steps
    transport: Any  # the receivers' transport config (TcpConfig ...), ready to connect
    receiver: type  # the transport's receiver class (weights/registry.py)
    reconnects: bool  # its receivers may connect again after a lost link (tcp)
    start_version: int
    engine: type  # the engine class (rollout/registry.py), resolved by the trainer's process
    reward_fn: Callable | None
    env: Callable | None
    group_reward: Callable | None
    sandboxes: Any = None  # a client of sandbox workers elsewhere (cluster/ray_sandboxes.py)
    role: str = "engine"  # its name in the trace ("engine-0")
    trace: bool = False  # record spans (core/trace.py) ...
    trace_dir: str | None = None  # ... into this shard folder (None: shipped with results)
    trace_node: str | None = None  # the Ray node that folder is on (None: this machine)
    registries: dict = field(default_factory=dict)  # core/registry.py snapshot of the trainer's


def tokenizer_fingerprint(tok) -> str:
    vocab = sorted(tok.get_vocab().items())
    return xxhash.xxh3_64(json.dumps([vocab, tok.pad_token_id, tok.eos_token_id]).encode()
                          ).hexdigest()


class _Batcher:
    """The engine as each task's runner sees it: generate() parks the requests; the serve loop
    runs everything parked in one engine call."""

    span = ("wait_batch", "episode")  # the runner's span while parked (envs/runner.py)

    def __init__(self, engine):
        self.engine, self.parked = engine, []

    @property
    def version(self) -> int:
        return self.engine.version

    async def generate(self, requests):
        future = asyncio.get_running_loop().create_future()
        self.parked.append((requests, future))
        return await future

    async def run_parked(self) -> None:
        batch, self.parked = self.parked, []
        out = await self.engine.generate([r for reqs, _ in batch for r in reqs])
        start = 0
        for reqs, future in batch:
            future.set_result(out[start : start + len(reqs)])
            start += len(reqs)


class EngineProcess:
    def __init__(self, spec: EngineSpec, requests, results):
        import torch

        from traingym.weights.sync import Subscriber, SubscriberConfig  # heavy: numpy, zstandard

        torch.set_num_threads(1)
        # this engine's env resources (envs/resources.py): its own pools, or the workers' client
        self.resources = RunResources(sandboxes=spec.sandboxes)
        r = spec.rollout
        self.requests, self.results, self.parent = requests, results, os.getppid()
        self.role = spec.role
        model, tok = load_policy(spec.ctx.model, seed=spec.ctx.seed)
        self.engine, _ = build(spec.ctx, model, tok, spec.engine)  # rollout/registry.py
        del model  # the engine holds its own copy
        self.engine.version = UNSERVED  # the built weights are never served
        make, transport = spec.receiver, spec.transport
        reconnect = ((lambda have: make(transport, have_hash=have)) if spec.reconnects
                     else None)  # a lost link (tcp) is connected again, saying what it holds
        self.subscriber = Subscriber(make(transport),
                                     SubscriberConfig(threads=spec.weights.threads),
                                     reconnect=reconnect)
        self.timeout_s = spec.weights.timeout_s
        with trace.span("wait_weights", cat="wait", version=spec.start_version):
            verified = self.subscriber.wait_for(spec.start_version, self.timeout_s)
        with trace.span("apply", cat="weights", version=self.subscriber.version):
            self.engine.update_weights(verified, self.subscriber.version)
        factory = episode_factory(tok, spec.task.prefill, spec.task.system_prompt, spec.env,
                                  spec.reward_fn)
        stop_ids = () if r.ignore_eos else stop_token_ids(tok)
        params = SamplingParams(r.temperature, r.top_p, r.top_k, r.max_new_tokens, stop_ids)
        if spec.inflight_updates:
            self.engine.between_steps = self.poll_weights  # in the decoding thread; the serve
            # loop, the other caller, waits for that decode meanwhile
        self.batcher = _Batcher(self.engine)
        self.runner = RolloutRunner(self.batcher, factory, params, r.group_size, tokenizer=tok,
                                    limits=EpisodeLimits(r.max_turns, r.max_context_tokens),
                                    group_reward=spec.group_reward, resources=self.resources)
        self.generate_s, self.updates = 0.0, 0
        self.blocked_since: int | None = None  # a job waits for weights since (trace)
        results.put(("ready", {"pid": os.getpid(), "tokenizer": tokenizer_fingerprint(tok),
                               "version": self.engine.version}))

    def poll_weights(self) -> None:
        """Apply every verified update that has arrived (none: return at once)."""

        advanced = False
        while True:
            try:
                advanced |= self.subscriber.poll(0.0)
            except TransportTimeout:
                break
        if advanced:
            with trace.span("apply", cat="weights", version=self.subscriber.version):
                self.engine.update_weights(self.subscriber.state, self.subscriber.version)
            self.updates += 1

    def report(self, version: int) -> None:
        """Wait for `version`, then report the hash of what the engine serves (its
        `state_hash`: read back from the engine where the engine can)."""
        self.subscriber.wait_for(version, self.timeout_s)
        self.poll_weights()
        if self.engine.version != self.subscriber.version:
            self.engine.update_weights(self.subscriber.state, self.subscriber.version)
        self.results.put(("report", {"version": self.engine.version,
                                     "hash": self.engine.state_hash(),
                                     "reconnects": self.subscriber.stats.reconnects}))

    async def run_job(self, job: Job) -> None:
        groups = await self.runner.collect_async([(job.key[0], job.row)], job.seed)
        meta = {"engine_version": self.engine.version, "generate_s": self.generate_s,
                "updates": self.updates, **dataclasses.asdict(self.subscriber.stats)}
        held = trace.drain()  # spans of an actor that cannot write the run directory
        if held:
            meta["trace"] = (held, self.role, os.getpid())  # trace.write_shipped's arguments
        self.results.put(("group", job.key, groups[0], meta))

    async def serve(self) -> None:
        import time

        tasks = self.jobs  # set by main(), which ends those still running when serving ends
        waiting: deque[Job] = deque()  # sent after weights that have not arrived yet
        while True:
            if os.getppid() != self.parent:
                return  # the trainer is gone
            while True:
                try:
                    job = self.requests.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    for t in tasks:
                        t.cancel()
                    return
                if isinstance(job, tuple):  # ("report", version): the final-weights check
                    self.report(job[1])
                    continue
                waiting.append(job)
            self.poll_weights()
            while waiting and waiting[0].version <= self.engine.version:
                tasks.add(asyncio.create_task(self.run_job(waiting.popleft())))
            self._note_blocked(bool(waiting))
            for _ in range(3):  # let new tasks reach their first generate call
                await asyncio.sleep(0)
            if self.batcher.parked:
                t0 = time.perf_counter()
                with trace.span("generate", cat="engine", calls=len(self.batcher.parked)):
                    await self.batcher.run_parked()
                self.generate_s += time.perf_counter() - t0
            else:
                await asyncio.sleep(0.002)
            for t in [t for t in tasks if t.done()]:
                tasks.discard(t)
                t.result()  # an env or reward that raised stops the engine, loudly

    def _note_blocked(self, blocked: bool) -> None:
        """Trace the time a job waits for weights that have not arrived ("wait_weights")."""
        if blocked and self.blocked_since is None:
            self.blocked_since = trace.now_us()
        elif not blocked and self.blocked_since is not None:
            trace.complete("wait_weights", "wait", self.blocked_since, trace.now_us())
            self.blocked_since = None

    async def main(self) -> None:
        """Serve; then, on this loop, end the jobs still running and close what the envs kept
        (a warm sandbox pool), on an error too."""

        self.jobs: set[asyncio.Task] = set()
        try:
            await self.serve()
        finally:
            for t in self.jobs:
                t.cancel()
            await asyncio.gather(*self.jobs, return_exceptions=True)
            try:
                await asyncio.wait_for(self.resources.close_loop(), CLOSE_TIMEOUT_S)
                self.resources.close()
            finally:
                self.engine.close()  # an engine may own a server process


def engine_main(spec: EngineSpec, requests, results) -> None:
    """Entry point of an engine process."""
    restore(spec.registries)  # names the trainer's process registered (codecs, backends ...)
    if spec.trace:
        trace.start(spec.trace_dir, spec.role)
    try:
        with trace.span("start", cat="setup"):  # model, engine, first weights
            proc = EngineProcess(spec, requests, results)
        asyncio.run(proc.main())
    except BaseException:
        results.put(("error", traceback.format_exc()))
        results.close()
        results.join_thread()  # the report reaches the trainer before the process exits
        raise
