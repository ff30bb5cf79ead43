"""One training step, shared by loop/sync.py and loop/async_loop.py: groups -> batch (the run's
algorithm) -> train -> publish -> checkpoint -> metrics -> log.

The loops differ only in where groups come from and where weights go, passed in as functions:
`take(n)` returns n more scored groups and the loop's figures for them; `publish(state,
version)` returns the sync figures (None: the run's colocated sync's); `loop_state()` is what a
checkpoint keeps beside the data position; `extend(metrics, seconds)` adds the loop's keys.
Dynamic sampling (DAPO): while fewer than rollout.prompts_per_step groups have signal, `take`
is asked for the missing ones, for at most `algorithm.max_sample_rounds` rounds; the batch is
rebuilt over every group sampled and cut to prompts_per_step kept groups.
"""

from __future__ import annotations

import time
from typing import Callable

from traingym.core import trace
from traingym.core.types import Batch, Group
from traingym.loop.trainer import build_algorithm


def fill_batch(algorithm, take: Callable, per_step: int) -> tuple[list[Group], Batch, dict, int]:
    """Groups sampled this step, their batch, the loop's merged figures, the rounds taken."""
    groups, info = take(per_step)
    batch, rounds = algorithm.build_batch(groups), 1
    while (algorithm.wants_more and len(batch.groups) < per_step
           and rounds < algorithm.knobs.max_sample_rounds):
        more, more_info = take(per_step - len(batch.groups))
        groups = groups + more
        info = merge_info(info, more_info)
        batch, rounds = algorithm.build_batch(groups), rounds + 1
    if algorithm.wants_more and len(batch.groups) > per_step:
        extra = len(batch.groups) - per_step
        batch = Batch(batch.groups[:per_step], batch.advantages_G[:per_step],
                      batch.num_dropped_groups + extra)
    return groups, batch, info, rounds


def merge_info(a: dict, b: dict) -> dict:
    """Two rounds' loop figures as one: lists joined, counts added, means weighted by the
    groups behind them, maxima kept, anything else the later round's."""
    out = dict(b)
    na, nb = len(a.get("prompt_indices", ())), len(b.get("prompt_indices", ()))
    for k, v in a.items():
        w = b.get(k)
        if isinstance(v, list) and isinstance(w, list):
            out[k] = v + w
        elif k.endswith("_mean") and w is not None and na + nb:
            out[k] = (v * na + w * nb) / (na + nb)
        elif k.endswith("_max") and w is not None:
            out[k] = max(v, w)
        elif k == "async_dropped" and w is not None:
            out[k] = v + w
    return out


def run_step(run, step: int, take: Callable, publish: Callable, algorithm=None,
             loop_state: Callable | None = None,
             extend: Callable | None = None) -> tuple[dict, bool]:
    """Train one step; returns (its record, whether a checkpoint was saved)."""
    cfg = run.cfg
    algorithm = algorithm or build_algorithm(cfg)
    t0, start_us = time.monotonic(), trace.now_us()
    with trace.span("collect", cat="loop", step=step + 1):  # sync: rollouts; async: the wait
        groups, batch, info, rounds = fill_batch(algorithm, take, cfg.rollout.prompts_per_step)
    t1 = time.monotonic()
    with trace.span("train_step", cat="trainer", step=step + 1):
        train_metrics = run.trainer.train_step(batch)
    t2 = time.monotonic()
    with trace.span("publish", cat="weights", version=step + 1):
        sync = publish(run.trainer.export(), step + 1)
    t3 = time.monotonic()
    state = loop_state() if loop_state else None
    saved = run.maybe_checkpoint(step, state)
    t4 = time.monotonic()
    seconds = {"rollout": t1 - t0, "train": t2 - t1, "sync": t3 - t2,
               "checkpoint": t4 - t3, "step": t4 - t0}
    metrics = run.step_metrics(step, groups, batch, train_metrics, seconds, saved)
    if sync is not None:
        metrics = {k: v for k, v in metrics.items() if not k.startswith("sync_")}
        metrics.update(sync)
    metrics.update(info)
    metrics.update(algorithm.metrics(batch))  # the algorithm's own figures (its file)
    if algorithm.wants_more:
        metrics["sample_rounds"] = rounds
    if extend:
        extend(metrics, seconds)
    trace.complete("step", "loop", start_us, trace.now_us(), step=step + 1)
    if getattr(run, "util", None) is not None:  # observability/utilisation.py
        metrics.update(run.util.keys(start_us, trace.now_us()))
    run.log.event(metrics)
    run.log.samples(step, groups)
    run.progress.update(step, metrics)
    # SIGTERM: a checkpoint of this step (runs/preempt.py), then stop
    run.stop_if_preempted(step, saved, loop_state() if loop_state else None)
    return metrics, saved
