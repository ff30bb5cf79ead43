"""traingym: reinforcement-learning post-training of language models.

Public API (imported lazily so that `import traingym` stays cheap):
  train(config, dataset=, eval_dataset=, reward=, run_dir=, resume=) -> TrainResult
  Config, build_config                       typed config and presets
  Sample, Completion, Group, Batch, ...      records crossing seams (traingym.core.types)
  MultiTurnEnv, Reply, ToolTask              multi-turn and tool-use envs (pass as env=)
  evaluate(model, ...) -> EvalResult         eval a model/checkpoint/endpoint (eval/run.py)
  compare_evals(a, b, ...)                   paired B - A over the same prompts
  open_run(run_dir) -> RunView, export(checkpoint, out)   runs as objects; HF export
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "train": ("traingym.api", "train"),
    "TrainResult": ("traingym.api", "TrainResult"),
    "Config": ("traingym.config.schema", "Config"),
    "build_config": ("traingym.config.load", "build_config"),
    "ConfigError": ("traingym.core.errors", "ConfigError"),
    "Sample": ("traingym.core.types", "Sample"),
    "Completion": ("traingym.core.types", "Completion"),
    "Group": ("traingym.core.types", "Group"),
    "Batch": ("traingym.core.types", "Batch"),
    "SamplingParams": ("traingym.core.types", "SamplingParams"),
    "GenerationRequest": ("traingym.core.types", "GenerationRequest"),
    "RewardError": ("traingym.envs.single_turn", "RewardError"),
    "MultiTurnEnv": ("traingym.envs.multi_turn", "MultiTurnEnv"),
    "Reply": ("traingym.envs.multi_turn", "Reply"),
    "ToolTask": ("traingym.envs.tools", "ToolTask"),
    "DatasetError": ("traingym.envs.datasets", "DatasetError"),
    "evaluate": ("traingym.eval.run", "evaluate"),
    "EvalResult": ("traingym.eval.run", "EvalResult"),
    "compare_evals": ("traingym.eval.run", "compare"),
    "open_run": ("traingym.api", "open_run"),
    "export": ("traingym.eval.export", "export"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'traingym' has no attribute {name!r}")


__all__ = sorted(_LAZY)
