"""What building an engine needs, and nothing more: `EngineContext`.

Every place that builds an engine (the run, its engine processes and Ray actors, evaluation,
serving, a judge, a distillation teacher) fills one of these and calls
`rollout.registry.build`, so engines never see a run's whole Config and side engines need no
made-up one. `options` are the raw engine options (the registry validates them against the
engine's `Options`); `model` is a model spec (models/spec.py), loaded only when `build` is not
given the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineContext:
    engine: str = "torch"  # registry name or "module:Class"
    options: dict = field(default_factory=dict)  # raw engine options, validated by the registry
    model: str = "embedded"  # model spec: 'embedded', 'tiny', an HF folder, a checkpoint
    # folder (RUN/checkpoints/step_N), a run directory
    dtype: str = "auto"  # 'auto' | 'bfloat16' | 'float32' (model.engine_dtype)
    max_batch_rows: int = 64
    seed: int = 0
