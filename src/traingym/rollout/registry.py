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

from traingym.rollout.base import EngineAbilities, RolloutEngine  # noqa: F401 (re-exported)

ENGINES: dict[str, str] = {
    "torch": "traingym.rollout.torch_engine:TorchEngine",
    "vllm": "traingym.rollout.vllm_engine:VLLMEngine",
    "openai": "traingym.rollout.openai_engine:OpenAIEngine",
    "sglang": "traingym.rollout.sglang_engine:SGLangEngine",
}


class UnknownEngine(ValueError):
    pass


def names() -> list[str]:
    return sorted(ENGINES)


def get(name: str) -> type:
    """The engine class for a registry name or a 'module:Class' path."""
    from traingym.core.errors import did_you_mean

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
    """The engine's validated Options from `rollout.engine_options`; a ValueError names each
    bad option, what is wrong with it, and the engine's options."""
    from pydantic import ValidationError

    from traingym.core.errors import did_you_mean

    model = get(name).Options
    try:
        return model(**raw)
    except ValidationError as e:
        known = sorted(model.model_fields)
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            hint = did_you_mean(key, known) if err["type"] == "extra_forbidden" else ""
            problems.append(f"{key!r}: {err['msg']}{hint}")
        raise ValueError(f"rollout.engine_options for {name!r}: {'; '.join(problems)} "
                         f"(its options: {known})") from None


def build_engine(cfg, model, tokenizer, cls: type | None = None) -> RolloutEngine:
    """The run's engine, as `rollout.engine` names it (or `cls`, the class already resolved:
    an engine process gets it from the trainer's process, whose registry may hold names its
    own does not), on `model`'s weights."""
    cls = cls or get(cfg.rollout.engine)
    return cls.from_config(cfg, model, tokenizer, cls.Options(**cfg.rollout.engine_options))


def check_engine(cfg) -> None:
    """Fail before any work when the run asks of its engine what the engine cannot do."""
    from traingym.core.errors import ConfigError

    name, can = cfg.rollout.engine, get(cfg.rollout.engine).abilities
    if not can.takes_weights:
        raise ConfigError(f"rollout.engine={name!r} is read-only (it takes no weight updates): "
                          "it can evaluate, judge or teach, not train; train with an engine "
                          f"that takes weights ({_able('takes_weights')})")
    if cfg.mode == "async" and not can.crosses_processes:
        raise ConfigError(f"mode='async' builds engines in their own processes from the config; "
                          f"rollout.engine={name!r} cannot be: use {_able('crosses_processes')} "
                          "or mode='sync'")
    if cfg.mode == "async" and cfg.async_.inflight_updates and not can.inflight_updates:
        raise ConfigError(f"async.inflight_updates needs an engine that swaps weights between "
                          f"decode steps; rollout.engine={name!r} does not: use "
                          f"{_able('inflight_updates')} or turn async.inflight_updates off")


def _able(ability: str) -> str:
    """The registered engines with `ability`, for error messages (loads each engine class;
    their heavy dependencies are imported only when an engine is built)."""
    return " or ".join(repr(n) for n in names() if getattr(get(n).abilities, ability))
