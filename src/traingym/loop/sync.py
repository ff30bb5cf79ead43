"""The RL loop, synchronous and colocated: sample, score, build the batch, train, sync weights.

Reads as the algorithm; the step itself (batch, train, publish, checkpoint, metrics) is
loop/step.py's, shared with the async loop; the run's parts are built in loop/build.py.
"""

from __future__ import annotations

from traingym.core import memory
from traingym.envs.runner import stream_seed
from traingym.loop.step import run_step
from traingym.loop.trainer import build_algorithm


def train_loop(run, start_step: int) -> dict:
    cfg, metrics = run.cfg, {}
    algorithm = build_algorithm(cfg)
    lend(run)  # the weights were just published (built, resumed, or after an SFT phase)
    for step in range(start_step, cfg.steps):
        rounds = []

        def take(n: int, step=step, rounds=rounds):
            # a refill round (dynamic sampling) draws new prompts under its own seed
            seed = stream_seed(cfg.seed, step, *([len(rounds)] if rounds else []))
            rounds.append(n)
            groups = run.rollouts.collect(run.data.take(n), seed=seed)
            release = getattr(run.engine, "release_derived", None)
            if release is not None:  # idle until the publish: its rebuildable copies go
                release()
            if cfg.trainer.trim_memory:
                memory.trim()
            return groups, {}

        def publish(state, version):
            take = getattr(run.trainer, "take_changes", None)
            run.weights.publish(state, version=version, changed=take() if take else None)
            lend(run)

        metrics, _ = run_step(run, step, take, publish, algorithm)
    return metrics


def lend(run) -> None:
    """The weights were just published: the engine's bf16 tensors are their casts, which the
    trainer's next step may read instead of casting its own (trainer/casts.py), and its
    optimizer step may record which of those values it changes, so the next publish reads only
    those (trainer/step_changes.py)."""
    lend_to = getattr(run.trainer, "lend", None)
    if lend_to is not None:
        lend_to(run.weights.lent_casts)
    track = getattr(run.trainer, "track_changes", None)
    if track is not None and run.weights.version is not None:
        track(run.weights.dtype, run.weights.version)
