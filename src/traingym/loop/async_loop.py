"""The asynchronous RL loop: engines in other processes keep sampling while the trainer trains.

The weights at step s are version s; a group's staleness is s minus the oldest version among its
tokens. A group staler than `async.max_staleness` is dropped and its prompt redone
(`async.recycle`) or skipped. Admission keeps drops rare: a prompt goes out only while
(dispatched - dropped) <= (steps done + max_staleness + 1) x prompts_per_step and fewer than
`async.queue_size` groups are out. Each prompt is trained on at most once and none is lost on
resume: checkpoints keep the ledger (`async_feed`) of prompts out or to redo, which a resumed
run dispatches first. The step is loop/step.py's, shared with the sync loop. Engines start
under spawn: the calling script needs a `__main__` guard and module-level hooks.
Not covered: reproducibility (what arrives when depends on timing); with `cluster.type='ray'`
only the engines go to Ray (cluster/ray.py), the trainer stays in this process.
"""

from __future__ import annotations

from collections import deque

from traingym.cluster.engine_process import Job
from traingym.cluster.local import EnginesSetup, LocalEngines
from traingym.config.engines import engine_context
from traingym.core.errors import ConfigError
from traingym.core.types import Group
from traingym.envs.runner import stream_seed
from traingym.loop.step import run_step
from traingym.loop.trainer import build_algorithm


def oldest_version(group: Group) -> int:
    """The oldest policy version among the group's tokens (environment tokens excluded)."""
    return min(v for s in group.samples for v in s.versions if v >= 0)


class Feed:
    """The trainer's ledger of prompts: out at the engines, to redo, dropped, skipped."""

    def __init__(self, data, seed: int, per_step: int, max_staleness: int, window: int,
                 recycle: bool, saved: dict | None = None):
        self.data, self.seed, self.per_step = data, seed, per_step
        self.max_staleness, self.window, self.recycle = max_staleness, window, recycle
        self.out: dict[tuple[int, int], dict] = {}  # key -> row
        self.redo: deque[tuple[int, int, dict]] = deque()  # (index, attempt, row)
        self.dispatched = self.dropped = 0  # since this process started: admission
        self.extra = 0  # groups taken beyond per_step a step (dynamic sampling's refills)
        self.dropped_total = self.skipped = 0
        if saved:  # a resumed run: what was out when the checkpoint was written is redone
            self.redo.extend((i, a, data.row(i)) for i, a in saved["redo"])
            self.dropped_total, self.skipped = saved["dropped_total"], saved["skipped"]

    def state(self) -> dict:
        """What a checkpoint keeps (JSON); the stream's position is saved with the run's."""
        redo = [[i, a] for i, a in self.out] + [[i, a] for i, a, _ in self.redo]
        return {"redo": sorted(redo), "dropped_total": self.dropped_total,
                "skipped": self.skipped}

    def jobs(self, steps_done: int) -> list[Job]:
        """New jobs the admission rule allows now."""
        out = []
        limit = (steps_done + self.max_staleness + 1) * self.per_step + self.extra
        while len(self.out) < self.window and self.dispatched - self.dropped < limit:
            if self.redo:
                index, attempt, row = self.redo.popleft()
            else:
                (index, row), attempt = self.data.take(1)[0], 0
            key = (index, attempt)
            self.out[key] = row
            self.dispatched += 1
            out.append(Job(key, row, stream_seed(self.seed, index, attempt)))
        return out

    def back(self, key) -> dict:
        return self.out.pop(key)

    def drop(self, key, row) -> None:
        self.dropped += 1
        self.dropped_total += 1
        if self.recycle:
            self.redo.append((key[0], key[1] + 1, row))
        else:
            self.skipped += 1

    def unfinished(self) -> list[int]:
        return sorted([k[0] for k in self.out] + [i for i, _, _ in self.redo])


def _take_fresh(engines: LocalEngines, feed: Feed, step: int, steps_done: int,
                n: int | None = None):
    """Wait for `n` (prompts_per_step) groups fresh enough for `step`; drop the stale ones."""
    groups, staleness, dropped, meta = [], [], [], {}
    while len(groups) < (n or feed.per_step):
        for job in feed.jobs(steps_done):
            engines.dispatch(job)
        key, group, meta = engines.next()
        row = feed.back(key)
        age = step - oldest_version(group)
        if age > feed.max_staleness:
            feed.drop(key, row)
            dropped.append(key[0])
            continue
        groups.append(group)
        staleness.append(age)
    for job in feed.jobs(steps_done):  # keep the engines busy while the trainer trains
        engines.dispatch(job)
    info = {"prompt_indices": [g.index for g in groups], "async_dropped_indices": dropped,
            "async_dropped": len(dropped), "async_staleness_mean": sum(staleness) / len(staleness),
            "async_staleness_max": max(staleness), "async_out": len(feed.out),
            "async_engine_version": meta.get("engine_version")}
    return groups, info


def async_train_loop(run, start_step: int) -> dict:
    cfg, a = run.cfg, run.cfg.async_
    saved = run.resumed.get("async_feed")
    if start_step and saved is None:
        raise ConfigError(f"{run.run_dir}: its last checkpoint (step {start_step}) holds no "
                          "async ledger (async_feed), so the prompts it had out are unknown; "
                          "start a new run directory")
    per_step = cfg.rollout.prompts_per_step
    feed = Feed(run.data, cfg.seed, per_step, a.max_staleness,
                a.queue_size or (a.max_staleness + 1) * per_step, a.recycle, saved)
    setup = EnginesSetup(engine_context(cfg), cfg.rollout, cfg.task, cfg.weights, a,
                         cfg.cluster, run.run_dir, run.trainer.export(), run.tokenizer,
                         run.inputs.reward_fn, run.inputs.env, run.inputs.group_reward)
    if cfg.cluster.type == "ray":
        from traingym.cluster.ray import RayEngines  # heavy: ray (local mode never imports it)

        engines = RayEngines(setup, start_step)
    else:
        engines = LocalEngines(setup, start_step)
    metrics: dict = {}
    try:
        algorithm = build_algorithm(cfg)
        for step in range(start_step, cfg.steps):
            taken = []

            def take(n: int, step=step, taken=taken):
                if taken:  # a refill (dynamic sampling): admit n more than the step's share
                    feed.extra += n
                taken.append(n)
                return _take_fresh(engines, feed, step, step - start_step, n)

            def extend(metrics: dict, seconds: dict, step=step) -> None:
                metrics.update(trainer_idle_frac=seconds["rollout"] / seconds["step"],
                               async_dropped_total=feed.dropped_total,
                               async_skipped_total=feed.skipped)
                if step + 1 == cfg.steps:
                    metrics["async_unfinished"] = feed.unfinished()
                    metrics["async_final_weights"] = engines.verify_final()
                metrics.update({f"async_{k}": v for k, v in engines.stats.items()})

            metrics, _ = run_step(run, step, take, engines.publish, algorithm,
                                  loop_state=lambda: {"async_feed": feed.state()},
                                  extend=extend)
    finally:
        engines.close()
    run.weights.publish(run.trainer.export(), version=cfg.steps)  # the in-process eval engine
    return metrics
