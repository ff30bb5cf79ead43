"""The rollout engines, one `Registry` (core/registry.py): name -> "module:Class", lazy; and
`build`, the one way to build an engine.

An engine is a class implementing rollout/base.py's `RolloutEngine`, plus one line in `ENGINES`,
with two class-level members:
- `Options`: a pydantic model of its settings, from `rollout.engine_options` (validated when
  the config is built, before any work starts);
- `from_context(ctx, model, tokenizer, options) -> engine`: `ctx` an EngineContext
  (rollout/context.py); `model`/`tokenizer` as traingym loaded them (the engine may copy or
  convert them but must not keep the caller's model; None for an engine that takes no weights).
`rollout.engine` is a name here or a "module:Class" path. Engines import heavy dependencies (vllm,
an HTTP client) inside methods, so choosing the built-in engine never imports them.
"""

from __future__ import annotations

from typing import Any

from traingym.core.errors import ConfigError, did_you_mean
from traingym.core.registry import Registry, RegistryError
from traingym.models import spec as model_spec
from traingym.rollout.context import EngineContext

ENGINES: dict[str, str] = {
    "torch": "traingym.rollout.torch_engine:TorchEngine",
    "vllm": "traingym.rollout.vllm_engine:VLLMEngine",
    "openai": "traingym.rollout.openai_engine:OpenAIEngine",
    "sglang": "traingym.rollout.sglang_engine:SGLangEngine",
}

MEMBERS = ("Options", "from_context", "generate", "update_weights")


class UnknownEngine(RegistryError):
    """An unknown rollout.engine, a path that does not import, or a class that is no engine."""


def _engine_class(name: str, cls):
    missing = [m for m in MEMBERS if not hasattr(cls, m)]
    if missing:
        raise TypeError(f"is not an engine class (it lacks {missing}; see rollout/registry.py)")
    return cls


REGISTRY = Registry("rollout.engine", ENGINES, check=_engine_class, error=UnknownEngine)


def names() -> list[str]:
    return sorted(ENGINES)


def get(name: str) -> type:
    """The engine class for a registry name or a 'module:Class' path."""
    return REGISTRY.get(name)


def options(name: str, raw: dict[str, Any]):
    """The engine's validated Options from `rollout.engine_options`; a ValueError names each
    bad option, what is wrong with it, and the engine's options."""
    from pydantic import ValidationError

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


def build(ctx: EngineContext, model=None, tokenizer=None, cls: type | None = None):
    """(engine, tokenizer) as `ctx` describes. Given `model` (and its `tokenizer`: the run's
    policy), the engine is built on it; else `ctx.model` (a model spec, models/spec.py) is
    loaded, or for an engine that takes no weights only its tokenizer (unless given).
    `cls`: the engine class already resolved (an engine process gets it from the trainer's
    process, whose registry may hold names its own does not)."""
    if cls is None:
        cls = get(ctx.engine)
        opts = options(ctx.engine, ctx.options)
    else:
        opts = cls.Options(**ctx.options)
    if model is None and cls.abilities.takes_weights:
        model, tokenizer = model_spec.load(ctx.model, seed=ctx.seed)
    elif tokenizer is None:
        if model is not None:
            raise ValueError("rollout.registry.build: a model was given without its tokenizer")
        tokenizer = model_spec.tokenizer(model_spec.resolve(ctx.model).model_path)
    return cls.from_context(ctx, model, tokenizer, opts), tokenizer


def check_engine(name: str, mode: str = "sync", inflight_updates: bool = False) -> None:
    """Fail before any work when a run (its `rollout.engine`, `mode`, and
    `async.inflight_updates`) asks of its engine what the engine cannot do."""
    can = get(name).abilities
    if not can.takes_weights:
        raise ConfigError(f"rollout.engine={name!r} is read-only (it takes no weight updates): "
                          "it can evaluate, judge or teach, not train; train with an engine "
                          f"that takes weights ({_able('takes_weights')})")
    if mode == "async" and not can.crosses_processes:
        raise ConfigError(f"mode='async' builds engines in their own processes from the config; "
                          f"rollout.engine={name!r} cannot be: use {_able('crosses_processes')} "
                          "or mode='sync'")
    if mode == "async" and inflight_updates and not can.inflight_updates:
        raise ConfigError(f"async.inflight_updates needs an engine that swaps weights between "
                          f"decode steps; rollout.engine={name!r} does not: use "
                          f"{_able('inflight_updates')} or turn async.inflight_updates off")


def _able(ability: str) -> str:
    """The registered engines with `ability`, for error messages (loads each engine class;
    their heavy dependencies are imported only when an engine is built)."""
    return " or ".join(repr(n) for n in REGISTRY.able(ability, names()))
