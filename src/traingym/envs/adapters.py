"""The env adapters, one `Registry` (core/registry.py): how a `task.env` spec becomes a maker.

An adapter is one record here: the spec prefix it claims ("gym:" claims "gym:<id>"; a prefix
without a colon, like "harbor", claims only itself), the "module:attr" of its maker factory
(imported on first use), and its abilities. Callers ask this module (`make`, `find`, `of`)
instead of testing prefixes or maker types. A spec no adapter claims is a 'module:function'
env (loop/inputs.py). Factories are called with (rest of the spec if the prefix ends in ":",
task.env_args if `takes_env_args`). Makers made here are picklable; cluster/local.py checks
any maker by pickling it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traingym.core.registry import Registry, one_of


@dataclass(frozen=True)
class Abilities:
    takes_env_args: bool = False
    """task.env_args are passed to the maker factory (any other env takes none)."""
    has_rows: bool = False
    """The maker brings its own rows, `maker.rows(num_heldout) -> (train, held-out)`, used
    when task.dataset is not given."""
    checks_config: bool = False
    """`maker.check(rollout)` raises ValueError when the env cannot run under the run's
    `rollout` section (verifiers: its turn limit against rollout.max_turns)."""


@dataclass(frozen=True)
class Adapter:
    prefix: str
    maker: str
    """The factory's "module:attr": (rest, env_args) -> an env maker (example, renderer) -> Env."""
    abilities: Abilities
    usage: str
    """The spec's form, for messages: "gym:<id>"."""
    needs: str = ""
    """Without rows of its own and without task.dataset: what the ConfigError says to set."""

    def claims(self, spec: str) -> bool:
        return spec.startswith(self.prefix) if self.prefix.endswith(":") else spec == self.prefix


_EPISODES = ("needs episodes: set task.dataset to rows like {prompt: '', seed: 0} (one per "
             "episode; envs/gym_text.py, envs/openenv_env.py)")


def _adapter(name: str, entry):
    if not isinstance(entry, Adapter):
        raise TypeError(f"is {type(entry).__name__}, not an envs.adapters.Adapter")
    return entry


ADAPTERS = Registry("task.env adapter", {
    "verifiers": Adapter("verifiers:", "traingym.envs.verifiers_env:VerifiersMaker",
                         Abilities(takes_env_args=True, has_rows=True, checks_config=True),
                         "verifiers:<env_id>"),
    "gym": Adapter("gym:", "traingym.envs.gym_text:GymMaker",
                   Abilities(takes_env_args=True), "gym:<id>", _EPISODES),
    "openenv": Adapter("openenv:", "traingym.envs.openenv_env:from_task",
                       Abilities(takes_env_args=True), "openenv:<server>", _EPISODES),
    "harbor": Adapter("harbor", "traingym.envs.harbor:HarborMaker", Abilities(), "harbor",
                      "needs its tasks: set task.dataset = 'harbor:<folder>' (a Harbor task "
                      "folder or a folder of them)"),
}, kind="record", check=_adapter)


def _factory(name: str, obj):
    if not callable(obj):
        raise TypeError(f"is {type(obj).__name__}, not callable")
    return obj


_FACTORIES = Registry("task.env maker", {}, kind="function", check=_factory)


def find(spec: str | None) -> Adapter | None:
    """The adapter that claims the task.env spec, or None (a 'module:function' env)."""
    if not spec:
        return None
    return next((a for a in map(ADAPTERS.get, ADAPTERS.names()) if a.claims(spec)), None)


def make(spec: str | None, env_args: dict[str, Any]):
    """The env maker for a task.env spec an adapter claims, or None."""
    adapter = find(spec)
    if adapter is None:
        return None
    args: list[Any] = [spec[len(adapter.prefix):]] if adapter.prefix.endswith(":") else []
    if adapter.abilities.takes_env_args:
        args.append(dict(env_args))
    return _FACTORIES.get(adapter.maker)(*args)


def of(maker) -> Adapter | None:
    """The adapter of a maker object (made here or passed as env=): its class names it in
    `env_adapter`; None for any other env."""
    name = getattr(type(maker), "env_adapter", None)
    return ADAPTERS.get(name) if isinstance(name, str) and name in ADAPTERS.entries else None


def rows(spec: str | None, env_args: dict[str, Any], num_heldout: int):
    """(training rows, held-out rows) of the env a task.env spec names, or None when its
    adapter brings no rows of its own."""
    adapter = find(spec)
    if adapter is None or not adapter.abilities.has_rows:
        return None
    return make(spec, env_args).rows(num_heldout)


def usages(ability: str) -> str:
    """The spec forms of the adapters with `ability`, for messages: "'a', 'b' or 'c'"."""
    return one_of([ADAPTERS.get(n).usage for n in ADAPTERS.able(ability)])
