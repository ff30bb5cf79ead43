"""The RL loop, synchronous and colocated: sample, score, build the batch, train, sync weights.

Reads as the algorithm; everything else is a named helper in run.py.
"""

from __future__ import annotations

import time

from traingym.algorithms.advantages import build_batch
from traingym.rollout.runner import stream_seed


def train_loop(run, start_step: int) -> dict:
    cfg, metrics = run.cfg, {}
    for step in range(start_step, cfg.steps):
        t0 = time.monotonic()
        examples = run.data.take(cfg.rollout.prompts_per_step)
        groups = run.rollouts.collect(examples, seed=stream_seed(cfg.seed, step))
        t1 = time.monotonic()
        batch = build_batch(groups, normalize_std=cfg.trainer.normalize_std)
        train_metrics = run.trainer.train_step(batch)
        t2 = time.monotonic()
        run.weights.publish(run.trainer.export(), version=step + 1)
        t3 = time.monotonic()
        saved = run.maybe_checkpoint(step)
        t4 = time.monotonic()
        metrics = run.step_metrics(step, groups, batch, train_metrics,
                                   {"rollout": t1 - t0, "train": t2 - t1, "sync": t3 - t2,
                                    "checkpoint": t4 - t3, "step": t4 - t0}, saved)
        run.log.event(metrics)
        run.log.samples(step, groups)
        run.progress.update(step, metrics)
        run.stop_if_preempted(step, saved)  # SIGTERM: a checkpoint of this step, then stop
    return metrics
