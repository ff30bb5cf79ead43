"""A seeded discrete-event simulator of the RL pipeline (sync or async), for sizing a cluster
and checking local runs against a model of them.

Models, after loop/async_loop.py and cluster/engine_process.py: engines running one batch at a
time (fixed + per-row + decode bound by aggregate or per-sequence token rate), lognormal env
steps in a pool of env_workers slots, data-parallel trainer ranks with a ring all-reduce,
weight sync fanned out as a binary-tree "broadcast" or one "sender", and admission/dispatch as
async_loop.Feed. The defaults' results are pinned by tests/unit/test_simulate.py.
size_cluster() searches the trainer/engine split of a GPU budget (and the env pool it needs).
Not covered: multi-turn episodes, completion-length spread, continuous batching across engine
calls, prefill, engine failures, CPU/memory-bandwidth contention, queue overheads, delta chains.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections import deque
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class SimConfig:
    steps: int = 30
    prompts_per_step: int = 8
    group_size: int = 4
    mode: str = "async"  # "sync" | "async"
    max_staleness: int = 1
    window: int = 0  # 0: (max_staleness + 1) x prompts_per_step
    engines: int = 1
    gen_fixed_s: float = 0.02
    gen_row_s: float = 0.003
    env_median_s: float = 0.05
    env_sigma: float = 1.0
    train_s: float = 0.25  # fixed part of a train step (all of it when the token rate is 0)
    publish_s: float = 0.01
    weight_bytes: float = 0.0
    link_bytes_per_s: float = 1e9
    link_latency_s: float = 0.0
    warmup: int = 3
    seed: int = 0
    env_workers: int = 0  # env slots (sandboxes) shared by all engines; 0: unlimited
    env_timeout_s: float = 0.0  # an env step is cut here (the sandbox's wall limit); 0: none
    completion_tokens: int = 0  # tokens per completion, for the decode-rate terms
    engine_tokens_per_s: float = 0.0  # one engine's decode rate at full batch; 0: not modelled
    seq_tokens_per_s: float = 0.0  # one sequence's decode rate alone; 0: no latency floor
    apply_s: float = 0.0  # an engine's pause to apply a new version
    trainer_gpus: int = 1  # data-parallel ranks
    train_tokens_per_sample: int = 0  # prompt + completion tokens trained per sample
    train_tokens_per_s_per_gpu: float = 0.0  # 0: the compute term is not modelled
    grad_bytes: float = 0.0  # gradient bytes all-reduced once per step
    allreduce_bytes_per_s: float = 1e11  # ring bus bandwidth per rank within a node
    node_gpus: int = 0  # GPUs per node; 0: the trainer is in one node
    internode_bytes_per_s: float = 0.0  # ring bus bandwidth of a trainer over several nodes
    fanout: str = "broadcast"  # "broadcast" | "sender"
    publish_waits_for_link: bool = False


@dataclass
class SimResult:
    trainer_idle_frac: float
    samples_per_s: float  # trained samples (drops excluded) per second
    seconds_per_step: float
    dropped: int
    staleness_mean: float
    step_seconds: list[float] = field(default_factory=list)
    # over the timed steps (after warmup):
    engine_util: float = 0.0  # fraction of engine time spent generating
    env_busy: float = 0.0  # mean number of env steps running
    env_util: float = 0.0  # env_busy / env_workers (0 when the pool is unlimited)
    env_wait_s: float = 0.0  # mean wait of an env step for a free slot
    stalled: bool = False  # stopped early: drops exceeded 20 x the prompts of the run


def decode_seconds(cfg: SimConfig, rows: int) -> float:
    """Decode time of a batch of `rows` completions (see the module docstring)."""
    per_token = max(rows / cfg.engine_tokens_per_s if cfg.engine_tokens_per_s else 0.0,
                    1 / cfg.seq_tokens_per_s if cfg.seq_tokens_per_s else 0.0)
    return cfg.completion_tokens * per_token


def allreduce_seconds(cfg: SimConfig) -> float:
    """Ring all-reduce of the gradients over trainer_gpus ranks, at the bandwidth of the
    ring's slowest link (the network once the trainer spans nodes)."""
    n = cfg.trainer_gpus
    spans = cfg.node_gpus and n > cfg.node_gpus
    rate = cfg.internode_bytes_per_s if spans else cfg.allreduce_bytes_per_s
    return 2 * (n - 1) / n * cfg.grad_bytes / rate


def train_seconds(cfg: SimConfig) -> float:
    """One train step: fixed part + tokens over the ranks' throughput + the all-reduce."""
    compute = 0.0
    if cfg.train_tokens_per_s_per_gpu:
        tokens = cfg.prompts_per_step * cfg.group_size * cfg.train_tokens_per_sample
        compute = tokens / (cfg.train_tokens_per_s_per_gpu * cfg.trainer_gpus)
    return cfg.train_s + compute + allreduce_seconds(cfg)


def link_seconds(cfg: SimConfig) -> float:
    """From publish until every engine holds the new version."""
    if cfg.fanout == "broadcast":
        depth = cfg.engines.bit_length()  # ceil(log2(engines + 1)) levels of a binary tree
        return cfg.link_latency_s * depth + cfg.weight_bytes / cfg.link_bytes_per_s
    return cfg.link_latency_s + cfg.engines * cfg.weight_bytes / cfg.link_bytes_per_s


class _Busy:
    """Busy intervals, summed over the timed window at the end."""

    def __init__(self):
        self.start, self.end = array("d"), array("d")

    def add(self, start: float, end: float) -> None:
        self.start.append(start)
        self.end.append(end)

    def seconds(self, t0: float, t1: float) -> float:
        import numpy as np

        s, e = np.frombuffer(self.start), np.frombuffer(self.end)
        return float((np.clip(e, t0, t1) - np.clip(s, t0, t1)).sum())


class _Pool:
    """Env slots taken FIFO: a step arriving at t starts when the earliest slot frees (exact
    FIFO, as the event loop hands arrivals over in time order); 0 workers: unlimited."""

    def __init__(self, cfg: SimConfig, rng: random.Random):
        self.cfg, self.rng = cfg, rng
        self.free = [0.0] * cfg.env_workers  # heap of the times each slot frees
        self.offset = 0.0  # added to the times recorded (sync: times from the step's start)
        self.busy = _Busy()
        self.waits: list[tuple[float, float, int]] = []  # (arrival, summed wait, steps)

    def reset(self, offset: float) -> None:
        self.free, self.offset = [0.0] * self.cfg.env_workers, offset

    def group(self, t: float, n: int) -> float:
        """n env steps arrive at t; returns when the slowest ends."""
        cfg, gauss = self.cfg, self.rng.gauss
        times = [cfg.env_median_s * math.exp(cfg.env_sigma * gauss(0, 1)) for _ in range(n)]
        if cfg.env_timeout_s:
            times = [min(x, cfg.env_timeout_s) for x in times]
        at = self.offset + t
        if not self.free:
            self.busy.start.extend([at] * n)
            self.busy.end.extend([at + x for x in times])
            return t + max(times)
        free, starts = self.free, []
        for x in times:
            starts.append(max(t, free[0]))
            heapq.heapreplace(free, starts[-1] + x)
        self.busy.start.extend([self.offset + s for s in starts])
        self.busy.end.extend([self.offset + s + x for s, x in zip(starts, times)])
        self.waits.append((at, sum(s - t for s in starts), n))
        return max(s + x for s, x in zip(starts, times))


def simulate(cfg: SimConfig) -> SimResult:
    if cfg.mode not in ("sync", "async") or cfg.fanout not in ("broadcast", "sender"):
        raise ValueError(f"mode {cfg.mode!r} / fanout {cfg.fanout!r}: unknown")
    return _sync(cfg) if cfg.mode == "sync" else _async(cfg)


def _sync(cfg: SimConfig) -> SimResult:
    pool = _Pool(cfg, random.Random(cfg.seed))
    P, G, E = cfg.prompts_per_step, cfg.group_size, cfg.engines
    shares = sorted(P // E + (e < P % E) for e in range(E))  # groups per engine, first done first
    steps, idle, gen = [], [], _Busy()
    t = 0.0
    for _ in range(cfg.steps):
        pool.reset(t)  # the last step's envs all ended before it trained; times from here
        wait = 0.0
        for rows in (n * G for n in shares if n):
            batch = cfg.gen_fixed_s + cfg.gen_row_s * rows + decode_seconds(cfg, rows)
            gen.add(t, t + batch)
            wait = max(wait, pool.group(batch, rows))
        steps.append(wait + train_seconds(cfg) + cfg.publish_s + link_seconds(cfg)
                     + cfg.apply_s)
        idle.append(wait)
        t += steps[-1]
    return _result(cfg, steps, idle, 0, [0.0], gen, pool)


class _Engine:
    def __init__(self):
        self.parked: list[int] = []  # job ids waiting for the next batch
        self.held = 0
        self.busy = False
        self.version = 0
        self.arrived = 0  # newest version delivered over the link
        self.ready = 0.0  # end of an apply started while idle


def _async(cfg: SimConfig) -> SimResult:
    pool = _Pool(cfg, random.Random(cfg.seed))
    k, P, G = cfg.max_staleness, cfg.prompts_per_step, cfg.group_size
    window = cfg.window or (k + 1) * P
    engines = [_Engine() for _ in range(cfg.engines)]
    load = [(0, e) for e in range(cfg.engines)]  # heap of (held, engine); stale entries skipped
    events: list = []  # (time, seq, kind, payload)
    seq = 0

    def push(t, kind, payload):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    def held(e, change):
        engines[e].held += change
        heapq.heappush(load, (engines[e].held, e))

    job_engine: dict[int, int] = {}
    arrived: deque[tuple[int, int]] = deque()  # (job, version) in arrival order
    out = dispatched = dropped = 0
    next_job = 0
    version, steps_done = 0, 0
    staleness: list[int] = []
    step_s, idle_s = [], []
    now, step_start = 0.0, 0.0
    taken: list[int] = []
    training = stalled = False
    gen = _Busy()
    link_s = link_seconds(cfg)

    def dispatch(t):
        nonlocal out, dispatched, next_job
        limit = (steps_done + k + 1) * P
        touched = set()
        while out < window and dispatched - dropped < limit:
            while load[0][0] != engines[load[0][1]].held:
                heapq.heappop(load)
            e = load[0][1]  # the engine holding the fewest (lowest index on ties)
            engines[e].parked.append(next_job)
            held(e, +1)
            job_engine[next_job] = e
            touched.add(e)
            next_job += 1
            out += 1
            dispatched += 1
        for e in sorted(touched):  # jobs sent together start one batch, as locally
            start_batch(e, t)

    def receive(e, v, t):
        eng = engines[e]
        eng.arrived = max(eng.arrived, v)
        if not eng.busy and eng.arrived > eng.version:
            eng.version, eng.ready = eng.arrived, t + cfg.apply_s

    def start_batch(e, t):
        eng = engines[e]
        if eng.busy or not eng.parked:
            return
        start = max(t, eng.ready)
        if eng.arrived > eng.version:
            start += cfg.apply_s
        eng.version = eng.arrived
        batch, eng.parked = eng.parked, []
        eng.busy = True
        end = (start + cfg.gen_fixed_s + cfg.gen_row_s * G * len(batch)  # sum order pinned
               + decode_seconds(cfg, G * len(batch)))                    # by test_simulate.py
        gen.add(start, end)
        push(end, "batch", (e, batch, eng.version))

    def take(t):
        """The trainer consumes arrivals while it collects; returns True when it can train."""
        nonlocal out, dropped
        while arrived and len(taken) < P:
            job, v = arrived.popleft()
            out -= 1
            if version - v > k:
                dropped += 1
            else:
                taken.append(job)
                staleness.append(version - v)
            dispatch(t)
        return len(taken) >= P

    dispatch(0.0)
    wait_since = 0.0
    idle_this = 0.0
    while steps_done < cfg.steps:
        if dropped > 20 * cfg.steps * P:
            stalled = True  # the engines cannot keep up with the staleness bound
            break
        now, _, kind, payload = heapq.heappop(events)
        if kind == "batch":
            e, batch, v = payload
            engines[e].busy = False
            for job in batch:
                push(pool.group(now, G), "group", (job, v))
            start_batch(e, now)
        elif kind == "group":
            job, v = payload
            held(job_engine.pop(job), -1)
            arrived.append((job, v))
        elif kind == "weights":
            receive(*payload, now)
        elif kind == "trained":
            version += 1
            steps_done += 1
            for e in range(len(engines)):
                if link_s > 0 and not cfg.publish_waits_for_link:
                    push(now + link_s, "weights", (e, version))
                else:  # as over a local transport: delivered before the next dispatch
                    receive(e, version, now)
            step_s.append(now - step_start)
            idle_s.append(idle_this)
            training, step_start, wait_since, idle_this = False, now, now, 0.0
            taken.clear()
            dispatch(now)
        if not training and take(now):
            idle_this += now - wait_since
            dispatch(now)
            training = True
            blocked = cfg.publish_s + (link_s if cfg.publish_waits_for_link else 0.0)
            push(now + train_seconds(cfg) + blocked, "trained", None)
    return _result(cfg, step_s, idle_s, dropped, staleness, gen, pool, stalled)


def _result(cfg, steps, idle, dropped, staleness, gen, pool, stalled=False) -> SimResult:
    timed, timed_idle = steps[cfg.warmup :], idle[cfg.warmup :]
    total = sum(timed)
    if not timed:
        return SimResult(1.0, 0.0, math.inf, dropped, 0.0, steps, stalled=True)
    t0 = sum(steps[: cfg.warmup])
    t1 = t0 + total
    env_busy = pool.busy.seconds(t0, t1) / total
    waits = [(w, n) for t, w, n in pool.waits if t0 <= t < t1]
    return SimResult(sum(timed_idle) / total,
                     len(timed) * cfg.prompts_per_step * cfg.group_size / total,
                     total / len(timed), dropped, sum(staleness) / max(len(staleness), 1),
                     steps, engine_util=gen.seconds(t0, t1) / (total * cfg.engines),
                     env_busy=env_busy,
                     env_util=env_busy / cfg.env_workers if cfg.env_workers else 0.0,
                     env_wait_s=sum(w for w, _ in waits) / max(sum(n for _, n in waits), 1),
                     stalled=stalled)


@dataclass(frozen=True)
class Plan:
    gpus: int
    trainer_gpus: int
    engines: int
    env_workers_needed: int  # smallest pool within pool_tolerance of the given pool's
                             # samples/s (to pool_resolution); the given pool if not searched
    result: SimResult  # with the given pool
    tried: tuple[tuple[int, float], ...]  # (trainer_gpus, samples/s) of every split simulated


def size_cluster(base: SimConfig, gpus: int, *, step: int = 1, gpus_per_engine: int = 1,
                 pool_tolerance: float | None = 0.02, pool_resolution: float = 0.05) -> Plan:
    """The split of `gpus` that maximises trained samples/s for `base` (its staleness bound,
    workload and env pool), then the smallest env pool that keeps within pool_tolerance of it.

    sync: colocated, no split: every GPU trains and generates (trainer_gpus = gpus, engines =
    gpus / gpus_per_engine). async: trainer_gpus in multiples of `step` (8: whole nodes),
    the rest engines of gpus_per_engine GPUs; searched coarse to fine (9 points, then the
    neighbourhood of the best), which assumes one peak. The pool search (skipped when
    pool_tolerance is None) is a bisection down to pool_resolution of the pool, which assumes
    more workers never lower samples/s (true up to the simulator's seeded noise).
    """
    def run(trainer: int, engines: int, workers: int) -> SimResult:
        return simulate(replace(base, trainer_gpus=trainer, engines=engines,
                                env_workers=workers))

    if base.mode == "sync":
        split = (gpus, gpus // gpus_per_engine)
        best = run(*split, base.env_workers)
        tried = ((gpus, best.samples_per_s),)
    else:
        options = [t for t in range(step, gpus, step) if (gpus - t) // gpus_per_engine >= 1]
        seen: dict[int, SimResult] = {}

        def score(i: int) -> float:
            t = options[i]
            if t not in seen:
                seen[t] = run(t, (gpus - t) // gpus_per_engine, base.env_workers)
            return seen[t].samples_per_s

        lo, hi = 0, len(options) - 1
        while True:
            grid = sorted({round(lo + j * (hi - lo) / 8) for j in range(9)})
            i = max(grid, key=score)
            if hi - lo <= 8:
                break
            at = grid.index(i)
            lo, hi = grid[max(at - 1, 0)], grid[min(at + 1, len(grid) - 1)]
        split = (options[i], (gpus - options[i]) // gpus_per_engine)
        best = seen[options[i]]
        tried = tuple(sorted((t, r.samples_per_s) for t, r in seen.items()))
    needed = base.env_workers
    if needed and pool_tolerance is not None:  # bisection over [1, the given pool]
        lo = 1
        while needed - lo > pool_resolution * needed:
            mid = (lo + needed) // 2
            if run(*split, mid).samples_per_s >= (1 - pool_tolerance) * best.samples_per_s:
                needed = mid
            else:
                lo = mid + 1
    return Plan(gpus, split[0], split[1], needed, best, tried)
