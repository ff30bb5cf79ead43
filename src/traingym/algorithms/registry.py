"""The RL algorithms, one `Registry` (core/registry.py): name -> "module:Class", lazy.

An algorithm is one file with a subclass of algorithms/base.py's `Algorithm` plus one line
here. A run picks one with `algorithm.name`: a name here, or a "module:Class" path to a class
in any importable package. docs/algorithms.md lists them with paper, config and tests.
"""

from __future__ import annotations

from traingym.core.registry import Registry, RegistryError


class UnknownAlgorithm(RegistryError):
    """An unknown algorithm.name, a path that does not import, or a class that is no Algorithm."""


def _algorithm(name: str, cls):
    from traingym.algorithms.base import Algorithm  # heavy: torch

    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError("not a subclass of traingym.algorithms.base.Algorithm")
    return cls


ALGORITHMS = Registry("algorithm.name", {
    "grpo": "traingym.algorithms.grpo:GRPO",
    "dr_grpo": "traingym.algorithms.dr_grpo:DrGRPO",
    "dapo": "traingym.algorithms.dapo:DAPO",
    "gspo": "traingym.algorithms.gspo:GSPO",
    "cispo": "traingym.algorithms.cispo:CISPO",
    "rloo": "traingym.algorithms.rloo:RLOO",
    "reinforce_pp": "traingym.algorithms.reinforce_pp:ReinforcePP",
    "ppo": "traingym.algorithms.ppo:PPO",
}, check=_algorithm, error=UnknownAlgorithm)

names = ALGORITHMS.names
get = ALGORITHMS.get  # the algorithm class for a registry name or a 'module:Class' path
