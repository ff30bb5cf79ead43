"""The RL algorithms, one registry: name -> "module:Class", imported on first use.

An algorithm is one file with a subclass of algorithms/base.py's `Algorithm` plus one line
here. A run picks one with `algorithm.name`: a name here, or a "module:Class" path to a class
in any importable package. docs/algorithms.md lists them with paper, config and tests.
"""

from __future__ import annotations

import importlib

ALGORITHMS: dict[str, str] = {
    "grpo": "traingym.algorithms.grpo:GRPO",
    "dr_grpo": "traingym.algorithms.dr_grpo:DrGRPO",
    "dapo": "traingym.algorithms.dapo:DAPO",
    "gspo": "traingym.algorithms.gspo:GSPO",
    "cispo": "traingym.algorithms.cispo:CISPO",
    "rloo": "traingym.algorithms.rloo:RLOO",
    "reinforce_pp": "traingym.algorithms.reinforce_pp:ReinforcePP",
    "ppo": "traingym.algorithms.ppo:PPO",
}


class UnknownAlgorithm(ValueError):
    pass


def names() -> list[str]:
    return sorted(ALGORITHMS)


def get(name: str) -> type:
    """The algorithm class for a registry name or a 'module:Class' path."""
    from traingym.algorithms.base import Algorithm
    from traingym.core.errors import did_you_mean

    target = ALGORITHMS.get(name, name)
    if ":" not in target:
        raise UnknownAlgorithm(f"unknown algorithm.name {name!r}; choose one of {names()} or "
                               f"give a 'module:Class' path{did_you_mean(name, ALGORITHMS)}")
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, SyntaxError) as e:
        raise UnknownAlgorithm(f"algorithm.name {name!r}: cannot load {target}: "
                               f"{type(e).__name__}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise UnknownAlgorithm(f"algorithm.name {name!r}: {target} is not a subclass of "
                               "traingym.algorithms.base.Algorithm")
    return cls


def build(cfg):
    """The run's algorithm, its knobs resolved from `cfg.algorithm` and rollout.max_new_tokens."""
    cls = get(cfg.algorithm.name)
    if cfg.distill.teacher is not None:  # the teacher scores every group (algorithms/distill.py)
        from traingym.algorithms.distill import distilling

        cls = distilling(cls, cfg.distill.coef, cfg.distill.reward_coef)
    return cls.from_config(cfg)
