"""The rollout engines, one registry: name -> "module:Class", imported on first use.

An engine is one file with a class that implements rollout/base.py's `RolloutEngine` and
two class-level members:

- `Options`: a pydantic model of its own settings, read from `rollout.engine_options` (the
  config validator checks them when the config is built, before any work starts);
- `from_config(cfg, model, tokenizer, options) -> engine`: `cfg` is the run's Config,
  `model`/`tokenizer` the policy as traingym loaded it (the engine's starting weights; an
  engine may copy, convert or save them; it must not keep training's model object).

plus one line in `ENGINES`. A run picks one with `rollout.engine`: a name here, or a
"module:Class" path to a class in any importable package. Engine modules import their heavy
dependencies (vllm, an HTTP client) inside methods, so choosing the built-in engine never
imports them.
"""

from __future__ import annotations

import importlib
from typing import Any

from traingym.rollout.base import RolloutEngine

ENGINES: dict[str, str] = {
    "torch": "traingym.rollout.torch_engine:TorchEngine",
}


class UnknownEngine(ValueError):
    pass


def names() -> list[str]:
    return sorted(ENGINES)


def get(name: str) -> type:
    """The engine class for a registry name or a 'module:Class' path."""
    from traingym.config import did_you_mean

    target = ENGINES.get(name, name)
    if ":" not in target:
        raise UnknownEngine(f"unknown rollout.engine {name!r}; choose one of {names()} or give "
                            f"a 'module:Class' path{did_you_mean(name, ENGINES)}")
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, SyntaxError) as e:
        raise UnknownEngine(f"rollout.engine {name!r}: cannot load {target}: "
                            f"{type(e).__name__}: {e}") from e
    missing = [m for m in ("Options", "from_config", "generate", "update_weights")
               if not hasattr(cls, m)]
    if missing:
        raise UnknownEngine(f"rollout.engine {name!r}: {target} is not an engine class "
                            f"(it lacks {missing}; see rollout/registry.py)")
    return cls


def options(name: str, raw: dict[str, Any]):
    """The engine's validated Options from `rollout.engine_options` (raises ValueError)."""
    return get(name).Options(**raw)


def build_engine(cfg, model, tokenizer) -> RolloutEngine:
    """The run's engine, as `rollout.engine` names it, on `model`'s weights."""
    cls = get(cfg.rollout.engine)
    return cls.from_config(cfg, model, tokenizer, cls.Options(**cfg.rollout.engine_options))
