"""What a run trains and is scored on, from its config and the arguments of `traingym.train`:
the rows, the reward function, the environment maker and the group hook (arguments first, then
config specs, then the built-in task). All checked before any model loads; a bad spec is a
ConfigError naming the key and the fix."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from traingym.config.schema import Config
from traingym.core.errors import ConfigError, did_you_mean
from traingym.envs import adapters
from traingym.envs.datasets import load_rows, validate_rows
from traingym.envs.judge import JudgeMaker
from traingym.envs.tasks import builtin_task, exact_answer


def import_reward(spec: str, key: str = "task.reward") -> Callable:
    """The callable `spec` ('module:function' or 'module:Class') names. A module that cannot
    be found or has a syntax error is a ConfigError naming `key`; any other exception the
    module raises while importing is its own bug and propagates with its traceback."""
    module, _, name = spec.partition(":")
    if not module or not name or module.startswith("."):
        raise ConfigError(f"{key}={spec!r}: expected 'module:function' with an absolute "
                          "module name, e.g. 'my_rewards:exact_match'")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ConfigError(f"{key}={spec!r}: cannot import {module!r} ({e}); is it installed "
                          "or on PYTHONPATH (run from the folder that holds it)?") from None
    except (ImportError, SyntaxError) as e:
        raise ConfigError(f"{key}={spec!r}: importing {module!r} failed: "
                          f"{type(e).__name__}: {e}") from None
    if not hasattr(mod, name):
        raise ConfigError(f"{key}={spec!r}: {module} has no function {name!r}"
                          f"{did_you_mean(name, [n for n in dir(mod) if not n.startswith('_')])}")
    fn = getattr(mod, name)
    if not callable(fn):
        raise ConfigError(f"{key}={spec!r}: {module}.{name} is {fn!r:.40}, not a function")
    return fn


@dataclass
class Inputs:
    train_rows: list[dict]
    eval_rows: list[dict]
    reward_fn: Callable | None  # None when `env` scores its own episodes
    env: Callable | None = None  # env maker (example, renderer) -> Env
    group_reward: Callable | None = None


def resolve_env(cfg: Config, env=None,
                group_reward=None) -> tuple[Callable | None, Callable | None]:
    """The env maker and group hook: arguments first, then config specs (an env adapter's
    prefix, envs/adapters.py, else 'module:function')."""
    t = cfg.task
    if env is None:
        env = adapters.make(t.env, t.env_args)
    if env is None and t.judge is not None:
        env = JudgeMaker(t.judge)
    env = env or (import_reward(t.env, "task.env") if t.env else None)
    group = group_reward or (import_reward(t.group_reward, "task.group_reward")
                             if t.group_reward else None)
    adapter = adapters.of(env)
    if adapter is not None and adapter.abilities.checks_config:
        try:
            env.check(cfg.rollout)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return env, group


def resolve_inputs(cfg: Config, dataset=None, eval_dataset=None, reward=None, env=None,
                   group_reward=None) -> Inputs:
    """Rows, reward, env: arguments first, then config paths, then the built-in task."""
    t = cfg.task
    env, group_reward = resolve_env(cfg, env, group_reward)
    adapter = adapters.of(env)
    if env is not None and reward is not None:
        raise ConfigError("pass either reward= (single-turn) or env= (the env scores its own "
                          "episodes), not both")
    custom = dataset is not None or t.dataset is not None
    if custom:
        train_rows = load_rows(dataset if dataset is not None else t.dataset, t.columns, t.split)
        src = eval_dataset if eval_dataset is not None else t.eval_dataset
        if src is None and t.eval_split is not None and t.dataset is not None:
            eval_rows = load_rows(t.dataset, t.columns, t.eval_split)[: cfg.eval.num_prompts]
        else:
            eval_rows = (load_rows(src, t.columns)[: cfg.eval.num_prompts] if src is not None
                         else [])
        reward_fn = reward or (import_reward(t.reward) if t.reward else None)
        if reward_fn is None and env is None:
            raise ConfigError("a custom dataset needs a reward: pass reward= or set "
                              "task.reward='module:function'")
    elif adapter is not None and adapter.abilities.has_rows:  # e.g. 'verifiers:...' or env=
        if eval_dataset is not None or t.eval_dataset is not None:
            raise ConfigError(f"task.eval_dataset needs task.dataset: a {adapter.usage!r} env "
                              "without task.dataset brings its own rows")
        train_rows, eval_rows = env.rows(cfg.eval.num_prompts)
        reward_fn = None
    else:
        spec = adapters.find(t.env)
        if spec is not None and spec.needs:
            raise ConfigError(f"task.env={t.env!r} {spec.needs}")
        if eval_dataset is not None or t.eval_dataset is not None:
            raise ConfigError("task.eval_dataset needs task.dataset: the built-in task "
                              f"{t.name!r} brings its own held-out rows")
        task = builtin_task(t.name, num_heldout=cfg.eval.num_prompts)
        train_rows, eval_rows = task.train, task.heldout
        reward_fn = reward or (import_reward(t.reward) if t.reward else exact_answer)
    validate_rows(train_rows, ("prompt",), "training dataset")
    if eval_rows:
        validate_rows(eval_rows, ("prompt",), "eval dataset")
    if env is not None:
        reward_fn = None
    return Inputs(train_rows, eval_rows, reward_fn, env, group_reward)
