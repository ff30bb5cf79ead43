"""The run's engine context: what `rollout.registry.build` needs, read from the run's Config.

The config layer is the one that sees the whole Config; engines get only this EngineContext
(rollout/context.py), so a run's engine, its engine processes and Ray actors, evaluation and
serving all build from the same few fields.
"""

from __future__ import annotations

from traingym.rollout.context import EngineContext


def engine_context(cfg) -> EngineContext:
    """`rollout.engine`, its options, `model.path`, `model.engine_dtype`,
    `rollout.max_batch_rows` and `seed` of a run's Config."""
    return EngineContext(engine=cfg.rollout.engine, options=dict(cfg.rollout.engine_options),
                         model=cfg.model.path, dtype=cfg.model.engine_dtype,
                         max_batch_rows=cfg.rollout.max_batch_rows, seed=cfg.seed)
