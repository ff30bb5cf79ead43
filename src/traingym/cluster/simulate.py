"""A seeded discrete-event simulator of the RL pipeline, sync or async, for sizing and for
checking the local runs against a model of them.

What it models, mirroring async_loop.py and cluster/engine_process.py:
- engines: each runs one batch at a time over every request parked with it; a batch of R
  rows takes gen_fixed_s + gen_row_s x R (calibrate from the engine alone); before each batch
  it applies the newest weights that have arrived;
- environments: every sample's step waits lognormal(median env_median_s, sigma env_sigma)
  after its batch ends; a group is done when its slowest sample is;
- the trainer: waits for prompts_per_step groups in arrival order, drops the ones older than
  max_staleness, trains for train_s, publishes for publish_s (blocked), and the new weights
  reach each engine after link_latency_s + weight_bytes / link_bytes_per_s;
- admission and dispatch exactly as async_loop.Feed: at most `window` groups out and
  (dispatched - dropped) <= (steps done + max_staleness + 1) x prompts_per_step; a job goes
  to the engine holding the fewest; dropped prompts are redone;
- sync: each step generates all groups in one batch, waits for the slowest sample, trains,
  publishes.
Not covered: multi-turn episodes, engine failures, contention between trainer and engine for
CPU or memory bandwidth, pickling and queue overheads (a few ms per group locally).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field


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
    train_s: float = 0.25
    publish_s: float = 0.01
    weight_bytes: float = 0.0
    link_bytes_per_s: float = 1e9
    link_latency_s: float = 0.0
    warmup: int = 3
    seed: int = 0


@dataclass
class SimResult:
    trainer_idle_frac: float
    samples_per_s: float
    seconds_per_step: float
    dropped: int
    staleness_mean: float
    step_seconds: list[float] = field(default_factory=list)


def _env_max(rng: random.Random, cfg: SimConfig, n: int) -> float:
    return max(cfg.env_median_s * math.exp(cfg.env_sigma * rng.gauss(0, 1)) for _ in range(n))


def simulate(cfg: SimConfig) -> SimResult:
    return _sync(cfg) if cfg.mode == "sync" else _async(cfg)


def _sync(cfg: SimConfig) -> SimResult:
    rng = random.Random(cfg.seed)
    rows = cfg.prompts_per_step * cfg.group_size
    steps, idle = [], []
    for _ in range(cfg.steps):
        wait = cfg.gen_fixed_s + cfg.gen_row_s * rows + _env_max(rng, cfg, rows)
        steps.append(wait + cfg.train_s + cfg.publish_s)
        idle.append(wait)
    return _result(cfg, steps, idle, 0, [0.0])


class _Engine:
    def __init__(self):
        self.parked: list[int] = []  # job ids waiting for the next batch
        self.held = 0
        self.busy = False
        self.version = 0
        self.arrived = 0  # newest version delivered over the link


def _async(cfg: SimConfig) -> SimResult:
    rng = random.Random(cfg.seed)
    k, P, G = cfg.max_staleness, cfg.prompts_per_step, cfg.group_size
    window = cfg.window or (k + 1) * P
    engines = [_Engine() for _ in range(cfg.engines)]
    events: list = []  # (time, seq, kind, payload)
    seq = 0

    def push(t, kind, payload):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    job_engine: dict[int, int] = {}
    arrived: list[tuple[int, int]] = []  # (job, version) in arrival order
    out = dispatched = dropped = 0
    next_job = 0
    version, steps_done = 0, 0
    staleness: list[int] = []
    step_s, idle_s = [], []
    now, step_start = 0.0, 0.0
    taken: list[int] = []
    training = False

    def dispatch(t):
        nonlocal out, dispatched, next_job
        limit = (steps_done + k + 1) * P
        while out < window and dispatched - dropped < limit:
            e = min(range(len(engines)), key=lambda i: engines[i].held)
            engines[e].parked.append(next_job)
            engines[e].held += 1
            job_engine[next_job] = e
            next_job += 1
            out += 1
            dispatched += 1
        for e in range(len(engines)):  # jobs sent together start one batch, as locally
            start_batch(e, t)

    def start_batch(e, t):
        eng = engines[e]
        if eng.busy or not eng.parked:
            return
        eng.version = eng.arrived
        batch, eng.parked = eng.parked, []
        eng.busy = True
        push(t + cfg.gen_fixed_s + cfg.gen_row_s * G * len(batch), "batch", (e, batch,
                                                                          eng.version))

    def take(t):
        """The trainer consumes arrivals while it collects; returns True when it can train."""
        nonlocal out, dropped
        while arrived and len(taken) < P:
            job, v = arrived.pop(0)
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
        now, _, kind, payload = heapq.heappop(events)
        if kind == "batch":
            e, batch, v = payload
            engines[e].busy = False
            for job in batch:
                push(now + _env_max(rng, cfg, G), "group", (job, v))
            start_batch(e, now)
        elif kind == "group":
            job, v = payload
            engines[job_engine.pop(job)].held -= 1
            arrived.append((job, v))
        elif kind == "weights":
            e, v = payload
            engines[e].arrived = max(engines[e].arrived, v)
        elif kind == "trained":
            version += 1
            steps_done += 1
            link_s = cfg.link_latency_s + cfg.weight_bytes / cfg.link_bytes_per_s
            for e in range(len(engines)):
                if link_s > 0:
                    push(now + link_s, "weights", (e, version))
                else:  # as over a local transport: delivered before the next dispatch
                    engines[e].arrived = version
            step_s.append(now - step_start)
            idle_s.append(idle_this)
            training, step_start, wait_since, idle_this = False, now, now, 0.0
            taken.clear()
            dispatch(now)
        if not training and take(now):
            idle_this += now - wait_since
            dispatch(now)
            training = True
            push(now + cfg.train_s + cfg.publish_s, "trained", None)
    return _result(cfg, step_s, idle_s, dropped, staleness)


def _result(cfg: SimConfig, steps, idle, dropped, staleness) -> SimResult:
    timed, timed_idle = steps[cfg.warmup :], idle[cfg.warmup :]
    total = sum(timed)
    return SimResult(sum(timed_idle) / total,
                     len(timed) * cfg.prompts_per_step * cfg.group_size / total,
                     total / len(timed), dropped, sum(staleness) / max(len(staleness), 1),
                     steps)
